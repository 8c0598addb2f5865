//go:build !js

package cas

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// writeAtv writes its buffers one after another, empty ones and all, at
// the offset given, and fails on a closed file.
func TestWriteAtv(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	data := randData(5, 200<<10)
	bufs := [][]byte{nil, data[:1], data[1:1], data[1 : 64<<10], {}, data[64<<10:]}
	if err := writeAtv(f, bufs, 7); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data)+7)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[7:], data) || !bytes.Equal(got[:7], make([]byte, 7)) {
		t.Fatal("file differs from the buffers written")
	}
	f.Close()
	if err := writeAtv(f, [][]byte{data[:10]}, 0); err == nil {
		t.Fatal("write to a closed file succeeded")
	}
}
