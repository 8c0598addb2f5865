// Command dump writes the specialized WGSL of the op library's Q4_K
// product of quantized x (q4k_matmul_xq) for a shape, as the decode step
// launches it, and its launch (grid and params) for q4kprobe's -ours
// mode (scripts/dawn/README.md).
//
//	go run ./scripts/dawn/dump -rows 6144 -cols 4096 -o /tmp/ours
//
// writes /tmp/ours.wgsl and /tmp/ours.launch (a line "gx gy gz" and a
// line of the params' bytes in hex).
package main

import (
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/rdrr/peer/gpu/ops"
)

func main() {
	rows := flag.Int("rows", 6144, "output rows")
	cols := flag.Int("cols", 4096, "columns (a multiple of 256)")
	out := flag.String("o", "ours", "output path prefix")
	flag.Parse()
	l, err := ops.Q4KXQLaunch(ops.DefaultQ4KConfig(*rows, *cols, 1), *rows, *cols)
	if err != nil {
		log.Fatal(err)
	}
	k, err := ops.Builtin(l.Kernel, l.Constants)
	if err != nil {
		log.Fatal(err)
	}
	src, err := k.Specialized()
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(*out+".wgsl", []byte(src), 0o644); err != nil {
		log.Fatal(err)
	}
	params := make([]byte, k.Params)
	copy(params, l.Params)
	launch := fmt.Sprintf("%d %d %d\n%s\n", l.Groups[0], l.Groups[1], l.Groups[2], hex.EncodeToString(params))
	if err := os.WriteFile(*out+".launch", []byte(launch), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s, %v, groups %v, %d params bytes\n", *out, l.Kernel, l.Constants, l.Groups, k.Params)
}
