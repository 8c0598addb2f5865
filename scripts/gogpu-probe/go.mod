module github.com/rdrr/peer/scripts/gogpu-probe

go 1.25

require (
	github.com/gogpu/gputypes v0.3.0
	github.com/gogpu/naga v0.18.0
	github.com/gogpu/wgpu v0.20.0
)

require (
	github.com/go-webgpu/goffi v0.4.2 // indirect
	golang.org/x/sys v0.41.0 // indirect
)
