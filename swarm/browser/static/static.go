// Package static holds the browser peer's page, as the daemon serves it
// at /app/: index.html and app.js (the shell: storage, identity key, the
// page's view), and, made by `make build` (scripts/build-wasm.sh), the
// WebAssembly peer (peer.wasm, from swarm/browser/app) and Go's
// wasm_exec.js. A binary built without them, or with the build tag
// nobrowser (the lent GPU machine's binaries: its transfers are bounded),
// serves a page that says so.
package static

import (
	"embed"
	"io/fs"
)

//go:embed files/index.html files/app.js
var shell embed.FS

// Files returns the page's files.
func Files() fs.FS {
	f, err := fs.Sub(pageFiles(), "files")
	if err != nil {
		panic(err) // the embedded directory exists: a build error otherwise
	}
	return f
}

// Built reports whether the WebAssembly peer was built into this binary.
func Built() bool {
	_, err := fs.Stat(Files(), "peer.wasm")
	return err == nil
}
