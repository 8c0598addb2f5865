//go:build !nobrowser

package static

import "embed"

// files are the shell and, once built, the WebAssembly peer.
//
//go:embed files
var files embed.FS

func pageFiles() embed.FS { return files }
