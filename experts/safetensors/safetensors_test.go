package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func sample(t testing.TB) []byte {
	var buf bytes.Buffer
	err := Write(&buf, []WriteTensor{
		{"a", "F32", []uint64{2, 2}, make([]byte, 16)},
		{"b", "F16", []uint64{3}, []byte{1, 2, 3, 4, 5, 6}},
		{"c", "BF16", []uint64{1}, []byte{9, 9}},
		{"d", "I64", []uint64{1}, make([]byte, 8)},
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	b := sample(t)
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 4 || f.Metadata["format"] != "pt" {
		t.Fatalf("%d tensors, metadata %v", len(f.Tensors), f.Metadata)
	}
	bt := f.Tensors[1]
	got := make([]byte, bt.Size())
	bt.Section().ReadAt(got, 0)
	if bt.Name != "b" || !bytes.Equal(got, []byte{1, 2, 3, 4, 5, 6}) {
		t.Errorf("tensor b: %s %v", bt.Name, got)
	}
	if f.Tensors[3].Supported() {
		t.Error("I64 reported as supported")
	}
}

func TestMalformed(t *testing.T) {
	good := sample(t)
	n := binary.LittleEndian.Uint64(good)
	hdr := string(good[8 : 8+n])
	with := func(h string) []byte {
		for len(h)%8 != 0 {
			h += " "
		}
		b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
		return append(append(b, h...), good[8+n:]...)
	}
	cases := map[string][]byte{
		"huge header":      binary.LittleEndian.AppendUint64(bytes.Clone(good[:0]), 1<<40),
		"header past end":  append(binary.LittleEndian.AppendUint64(nil, 100), '{', '}'),
		"not json":         with("{" + hdr[2:]),
		"unknown dtype":    with(strings.Replace(hdr, `"F16"`, `"Q4"`, 1)),
		"shape mismatch":   with(strings.Replace(hdr, `"shape":[3]`, `"shape":[4]`, 1)),
		"offset past end":  with(strings.Replace(hdr, `"data_offsets":[24,32]`, `"data_offsets":[24,3000]`, 1)),
		"unknown field":    with(strings.Replace(hdr, `"dtype":"F16"`, `"dtype":"F16","x":1`, 1)),
		"trailing garbage": append(bytes.Clone(good), 0),
		"overlap":          with(strings.Replace(hdr, `"data_offsets":[22,24]`, `"data_offsets":[20,22]`, 1)),
		"gap":              with(strings.Replace(hdr, `"shape":[2,2],"data_offsets":[0,16]`, `"shape":[2,1],"data_offsets":[0,8]`, 1)),
		"duplicate name":   with(strings.Replace(hdr, `"b":`, `"a":`, 1)),
		"after the object": with(hdr + "x"),
		"not an object":    with("[" + hdr + "]"),
		"I64 shape":        with(strings.Replace(hdr, `"dtype":"I64","shape":[1]`, `"dtype":"I64","shape":[2]`, 1)),
		"F4 half a byte":   with(strings.Replace(hdr, `"dtype":"BF16","shape":[1]`, `"dtype":"F4","shape":[3]`, 1)),
	}
	for _, want := range []string{`"data_offsets":[22,24]`, `"data_offsets":[24,32]`, `"b":`, `"dtype":"I64","shape":[1]`, `"dtype":"BF16","shape":[1]`, `"shape":[2,2],"data_offsets":[0,16]`} {
		if !strings.Contains(hdr, want) {
			t.Fatalf("the sample's header changed: %s lacks %s", hdr, want)
		}
	}
	if false {
		t.Fatalf("the sample's header changed: %s", hdr)
	}
	for name, b := range cases {
		if _, err := Read(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
	}
}

func TestOpenDirIndex(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, ts []WriteTensor) {
		var buf bytes.Buffer
		Write(&buf, ts, nil)
		os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644)
	}
	write("model-00001-of-00002.safetensors", []WriteTensor{{"x", "F32", []uint64{1}, make([]byte, 4)}})
	write("model-00002-of-00002.safetensors", []WriteTensor{{"y", "F16", []uint64{1}, make([]byte, 2)}})
	index := `{"metadata":{},"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}`
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(index), 0o644)
	m, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Tensors) != 2 {
		t.Fatalf("%d tensors", len(m.Tensors))
	}
	m.Close()
	for name, bad := range map[string]string{
		"escaping path": `{"weight_map":{"x":"../x.safetensors"}}`,
		"wrong file":    `{"weight_map":{"x":"model-00002-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}}`,
		"missing name":  `{"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors","z":"model-00002-of-00002.safetensors"}}`,
	} {
		os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), []byte(bad), 0o644)
		if m, err := OpenDir(dir); err == nil {
			m.Close()
			t.Errorf("%s: opened", name)
		}
	}
}

// FuzzSafetensorsHeader: Read never panics; what it accepts covers the
// data exactly, and writes back to a file that reads the same.
func FuzzSafetensorsHeader(f *testing.F) {
	f.Add(sample(f))
	f.Fuzz(func(t *testing.T, b []byte) {
		sf, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v is not ErrFormat", err)
			}
			return
		}
		var sum int64
		ts := make([]WriteTensor, len(sf.Tensors))
		for i, tn := range sf.Tensors {
			sum += tn.Size()
			data := make([]byte, tn.Size())
			if _, err := tn.Section().ReadAt(data, 0); err != nil && len(data) > 0 {
				t.Fatal(err)
			}
			ts[i] = WriteTensor{tn.Name, tn.DType, tn.Shape, data}
		}
		n := binary.LittleEndian.Uint64(b)
		if sum != int64(len(b))-8-int64(n) {
			t.Fatalf("tensors hold %d bytes; data is %d", sum, int64(len(b))-8-int64(n))
		}
		var buf bytes.Buffer
		if err := Write(&buf, ts, sf.Metadata); err != nil {
			t.Fatal(err)
		}
		again, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatalf("reading what was written back: %v", err)
		}
		if len(again.Tensors) != len(sf.Tensors) {
			t.Fatalf("%d tensors read back; want %d", len(again.Tensors), len(sf.Tensors))
		}
		for i, tn := range again.Tensors {
			w := sf.Tensors[i]
			if tn.Name != w.Name || tn.DType != w.DType || !slices.Equal(tn.Shape, w.Shape) || tn.Size() != w.Size() {
				t.Fatalf("tensor %d read back as %s %s %v; want %s %s %v", i, tn.Name, tn.DType, tn.Shape, w.Name, w.DType, w.Shape)
			}
		}
	})
}
