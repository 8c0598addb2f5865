//go:build nobrowser

package static

import "embed"

// pageFiles are the shell alone: this binary carries no WebAssembly peer.
func pageFiles() embed.FS { return shell }
