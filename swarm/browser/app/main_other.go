//go:build !js

package main

import (
	"fmt"
	"os"
)

// main: the browser peer runs only as WebAssembly in a page.
func main() {
	fmt.Fprintln(os.Stderr, "the browser peer is built with GOOS=js GOARCH=wasm (make build) and served by `peer daemon` at /app/")
	os.Exit(2)
}
