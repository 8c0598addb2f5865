package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func testFile(t testing.TB, alignment uint64) ([]byte, []KV, []WriteTensor) {
	kv := []KV{
		{"general.architecture", "llama"},
		{"general.name", "odd"}, // odd-length strings shift everything after them
		{"llama.block_count", uint32(1)},
		{"llama.rope.freq_base", float32(10000)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"flag", true},
		{"i64", int64(-5)},
		{"f64", 2.5},
		{"u8", uint8(7)},
		{"tokenizer.ggml.tokens", Array{TypeString, []string{"<s>", "a", "bc", "\xff"}}},
		{"tokenizer.ggml.scores", Array{TypeFloat32, []float32{0, -1, -2, -3}}},
		{"tokenizer.ggml.token_type", Array{TypeInt32, []int32{3, 1, 1, 6}}},
		{"nested", Array{TypeArray, []any{Array{TypeUint8, []any{uint8(1)}}}}},
	}
	q := make([]byte, 2*144)
	for i := range q {
		q[i] = byte(i * 7)
	}
	ts := []WriteTensor{
		{"a.weight", []uint64{3}, F32, make([]byte, 12)}, // 12 bytes: the next needs padding
		{"b.weight", []uint64{256, 2}, Q4_K, q},
		{"c.weight", []uint64{5, 1}, F16, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		{"d.weight", []uint64{2}, BF16, []byte{1, 2, 3, 4}},
	}
	var buf bytes.Buffer
	if err := Write(&buf, kv, ts, alignment); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), kv, ts
}

func TestRoundTrip(t *testing.T) {
	for _, al := range []uint64{0, 1, 8, 64, 4096} {
		b, kv, ts := testFile(t, al)
		f, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("alignment %d: %v", al, err)
		}
		want := max(al, 0)
		if al == 0 {
			want = DefaultAlignment
		}
		if f.Alignment != want || f.DataOffset%want != 0 {
			t.Errorf("alignment %d: read alignment %d, data at %d", al, f.Alignment, f.DataOffset)
		}
		for _, x := range kv {
			v, ok := f.Get(x.Key)
			if !ok || !reflect.DeepEqual(v, x.Value) {
				t.Errorf("%s = %#v; want %#v", x.Key, v, x.Value)
			}
		}
		for i, w := range ts {
			g := f.Tensors[i]
			if g.Name != w.Name || !reflect.DeepEqual(g.Dims, w.Dims) || g.Type != w.Type || g.Offset%f.Alignment != 0 {
				t.Fatalf("tensor %d: %+v; want %+v", i, g, w)
			}
			data := make([]byte, g.Size)
			if _, err := g.Section().ReadAt(data, 0); err != nil && g.Size > 0 {
				t.Fatal(err)
			}
			if !bytes.Equal(data, w.Data) {
				t.Errorf("%s: data differs", w.Name)
			}
		}
		toks, _ := f.Strings("tokenizer.ggml.tokens")
		if len(toks) != 4 || toks[2] != "bc" {
			t.Errorf("tokens %q", toks)
		}
	}
}

func TestMalformed(t *testing.T) {
	good, _, _ := testFile(t, 32)
	f, _ := Read(bytes.NewReader(good), int64(len(good)))
	// Offsets of header fields, found by writing them.
	mutate := func(fn func(b []byte)) []byte {
		b := bytes.Clone(good)
		fn(b)
		return b
	}
	tensorTable := bytes.Index(good, []byte("a.weight"))
	cases := map[string][]byte{
		"bad magic":         mutate(func(b []byte) { b[0] = 'X' }),
		"version 4":         mutate(func(b []byte) { b[4] = 4 }),
		"huge tensor count": mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[8:], 1<<40) }),
		"huge kv count":     mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[16:], 1<<40) }),
		"huge key length":   mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[24:], 1<<62) }),
		"zero dims":         mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[tensorTable+8:], 0) }),
		"five dims":         mutate(func(b []byte) { binary.LittleEndian.PutUint32(b[tensorTable+8:], 5) }),
		"huge dim":          mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[tensorTable+12:], 1<<62) }),
		"unaligned offset":  mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[tensorTable+8+4+8+4:], 3) }),
		"past the end":      mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[tensorTable+8+4+8+4:], 1<<20) }),
		"overlap":           mutate(func(b []byte) { binary.LittleEndian.PutUint64(b[tensorTable+8+4+8+4:], f.Tensors[1].Offset) }),
		"truncated data":    good[:len(good)-1],
		"truncated header":  good[:40],
	}
	for name, b := range cases {
		if _, err := Read(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
	}
}

func FuzzGGUF(f *testing.F) {
	for _, al := range []uint64{32, 64} {
		b, _, _ := testFile(f, al)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		for _, tn := range g.Tensors {
			if g.DataOffset+tn.Offset+tn.Size > uint64(len(b)) {
				t.Fatalf("tensor %q outside the file", tn.Name)
			}
		}
	})
}
