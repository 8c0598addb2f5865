package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"runtime"
	"slices"
	"sync/atomic"
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
		{"nested", Array{TypeArray, []Array{{TypeUint8, []uint8{1}}, {TypeString, []string{"", "xyz"}}}}},
		{"empty", ""},
		{"i8", int8(-3)}, {"u16", uint16(65535)}, {"i16", int16(-300)}, {"i32", int32(-70000)}, {"u64", uint64(1) << 60},
		{"a.u8", Array{TypeUint8, []uint8{1, 2, 3}}}, {"a.i8", Array{TypeInt8, []int8{-1}}},
		{"a.u16", Array{TypeUint16, []uint16{9}}}, {"a.i16", Array{TypeInt16, []int16{-9, 9}}},
		{"a.u32", Array{TypeUint32, []uint32{}}}, {"a.bool", Array{TypeBool, []bool{true, false, true}}},
		{"a.u64", Array{TypeUint64, []uint64{1 << 63}}}, {"a.i64", Array{TypeInt64, []int64{-1 << 63}}},
		{"a.f64", Array{TypeFloat64, []float64{0.5, -2}}},
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
		"big-endian":        mutate(func(b []byte) { binary.BigEndian.PutUint32(b[4:], 3) }),
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

// Tensors of known types the converter does not read are sized and
// bounded like the others, and reported by name; unknown type ids and rows
// that are not whole blocks are malformed.
func TestTensorTypes(t *testing.T) {
	var buf bytes.Buffer
	err := Write(&buf, nil, []WriteTensor{
		{"q8", []uint64{64, 3}, Q8_0, make([]byte, 2*3*34)},
		{"iq4", []uint64{512}, IQ4_XS, make([]byte, 2*136)},
		{"q4k", []uint64{256}, Q4_K, make([]byte, 144)},
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	f, err := Read(bytes.NewReader(good), int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		size      uint64
		name      string
		supported bool
	}{{204, "Q8_0", false}, {272, "IQ4_XS", false}, {144, "Q4_K", true}} {
		tn := f.Tensors[i]
		if tn.Size != want.size || tn.Type.String() != want.name || tn.Type.Supported() != want.supported || tn.Section().Size() != int64(want.size) {
			t.Errorf("tensor %s: size %d, type %s, supported %v; want %d, %s, %v", tn.Name, tn.Size, tn.Type, tn.Type.Supported(), want.size, want.name, want.supported)
		}
	}
	typeAt := bytes.Index(good, []byte("q8")) + 2 + 4 + 16
	for name, c := range map[string]struct {
		at  int
		val uint32
	}{
		"removed type 4":        {typeAt, 4},
		"unknown type 99":       {typeAt, 99},
		"Q8_0 row of 65":        {typeAt - 16, 65},
		"Q4_K row of 128":       {bytes.Index(good, []byte("q4k")) + 3 + 4, 128},
		"Q8_0 bigger than data": {typeAt - 8, 1 << 30},
	} {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[c.at:], c.val)
		if _, err := Read(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
	}
	if err := Write(io.Discard, nil, []WriteTensor{{"x", []uint64{4}, TensorType(4), make([]byte, 4)}}, 0); err == nil {
		t.Error("Write of an unknown type succeeded")
	}
}

func TestTokenizer(t *testing.T) {
	base := []KV{
		{"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.pre", "llama-bpe"},
		{"tokenizer.ggml.tokens", Array{TypeString, []string{"<s>", "</s>", "a", "b", "ab"}}},
		{"tokenizer.ggml.scores", Array{TypeFloat32, []float32{0, 0, -1, -2, -3}}},
		{"tokenizer.ggml.token_type", Array{TypeInt32, []int32{3, 3, 1, 1, 1}}},
		{"tokenizer.ggml.merges", Array{TypeString, []string{"a b"}}},
		{"tokenizer.ggml.bos_token_id", uint32(0)},
		{"tokenizer.ggml.eos_token_id", uint32(1)},
	}
	read := func(kv []KV) (*Tokenizer, error) { return readTokenizer(t, kv) }
	tk, err := read(base)
	if err != nil {
		t.Fatal(err)
	}
	want := &Tokenizer{Model: "gpt2", Pre: "llama-bpe", Tokens: []string{"<s>", "</s>", "a", "b", "ab"},
		Scores: []float32{0, 0, -1, -2, -3}, Types: []int32{3, 3, 1, 1, 1}, Merges: []string{"a b"}, BOS: 0, EOS: 1, UNK: -1, PAD: -1}
	if !reflect.DeepEqual(tk, want) {
		t.Errorf("Tokenizer() = %+v; want %+v", tk, want)
	}
	if tk, err := read(nil); tk != nil || err != nil {
		t.Errorf("no tokenizer: %v, %v; want nil, nil", tk, err)
	}
	with := func(key string, v any) []KV {
		kv := slices.Clone(base)
		for i := range kv {
			if kv[i].Key == key {
				kv[i].Value = v
				return kv
			}
		}
		return append(kv, KV{key, v})
	}
	for name, kv := range map[string][]KV{
		"tokens not strings": with("tokenizer.ggml.tokens", Array{TypeInt32, []int32{1}}),
		"short scores":       with("tokenizer.ggml.scores", Array{TypeFloat32, []float32{0}}),
		"scores of int32":    with("tokenizer.ggml.scores", Array{TypeInt32, []int32{0, 0, 0, 0, 0}}),
		"long types":         with("tokenizer.ggml.token_type", Array{TypeInt32, make([]int32, 6)}),
		"merges not strings": with("tokenizer.ggml.merges", "a b"),
		"bos out of range":   with("tokenizer.ggml.bos_token_id", uint32(5)),
		"eos negative":       with("tokenizer.ggml.eos_token_id", int32(-1)),
		"unk a string":       with("tokenizer.ggml.unknown_token_id", "2"),
		"model not a string": with("tokenizer.ggml.model", uint8(1)),
	} {
		if _, err := read(kv); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
	}
}

// readCounter counts the bytes read through it.
type readCounter struct {
	r io.ReaderAt
	n atomic.Int64
}

func (c *readCounter) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n.Add(int64(n))
	return n, err
}

// Read reads the header, not the data: a file with 8 MiB of tensors costs
// the header plus at most one read-ahead buffer.
func TestReadDoesNotReadData(t *testing.T) {
	var buf bytes.Buffer
	big := make([]byte, 8<<20)
	if err := Write(&buf, []KV{{"general.name", "big"}}, []WriteTensor{{"x", []uint64{2 << 20}, F32, big}}, 0); err != nil {
		t.Fatal(err)
	}
	rc := &readCounter{r: bytes.NewReader(buf.Bytes())}
	f, err := Read(rc, int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if n := rc.n.Load(); n > int64(f.DataOffset)+1<<16 {
		t.Errorf("Read read %d bytes of a file whose header is %d", n, f.DataOffset)
	}
}

// Padding between the header and the data, and between tensors, is
// zeros; the data starts at the first aligned offset after the header.
func TestWritePadding(t *testing.T) {
	for _, al := range []uint64{1, 32, 64, 256} {
		b, _, ts := testFile(t, al)
		f, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		end := uint64(0)
		for i, tn := range f.Tensors {
			gap := b[f.DataOffset+end : f.DataOffset+tn.Offset]
			if !bytes.Equal(gap, make([]byte, len(gap))) || uint64(len(gap)) >= al && i > 0 {
				t.Errorf("alignment %d: %d padding bytes before %s: % x", al, len(gap), tn.Name, gap)
			}
			end = tn.Offset + uint64(len(ts[i].Data))
		}
		if uint64(len(b)) != f.DataOffset+end {
			t.Errorf("alignment %d: %d bytes after the last tensor", al, uint64(len(b))-f.DataOffset-end)
		}
	}
}

// FuzzGGUF: Read never panics or allocates from an unchecked number, every
// tensor it accepts lies inside the file, and what it reads writes back
// to a file that reads the same (write(read(write(read(b))))).
func FuzzGGUF(f *testing.F) {
	for _, al := range []uint64{32, 64, 1} {
		b, _, _ := testFile(f, al)
		f.Add(b)
	}
	rewrite := func(t *testing.T, g *File) []byte {
		ts := make([]WriteTensor, len(g.Tensors))
		for i, tn := range g.Tensors {
			data := make([]byte, tn.Size)
			if _, err := tn.Section().ReadAt(data, 0); err != nil && tn.Size > 0 {
				t.Fatalf("tensor %q: %v", tn.Name, err)
			}
			ts[i] = WriteTensor{tn.Name, tn.Dims, tn.Type, data}
		}
		var buf bytes.Buffer
		if err := Write(&buf, g.KV, ts, g.Alignment); err != nil {
			t.Fatalf("rewriting what Read accepted: %v", err)
		}
		return buf.Bytes()
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v is not ErrFormat", err)
			}
			return
		}
		for _, tn := range g.Tensors {
			if g.DataOffset+tn.Offset+tn.Size > uint64(len(b)) {
				t.Fatalf("tensor %q outside the file", tn.Name)
			}
		}
		g.Tokenizer() // must not panic
		w1 := rewrite(t, g)
		g2, err := Read(bytes.NewReader(w1), int64(len(w1)))
		if err != nil {
			t.Fatalf("reading the rewritten file: %v", err)
		}
		if w2 := rewrite(t, g2); !bytes.Equal(w1, w2) {
			t.Fatal("the rewritten file does not read back the same")
		}
	})
}

// A count is bounded by the bytes that could hold it before anything is
// allocated: a 100-byte file that claims 2^26-1 array elements, or 2^20-1
// tensors, costs kilobytes, not gigabytes.
func TestCountsBoundAllocation(t *testing.T) {
	header := func(ntensors, nkv uint64) *bytes.Buffer {
		var b bytes.Buffer
		b.WriteString(Magic)
		b.Write(binary.LittleEndian.AppendUint32(nil, 3))
		b.Write(binary.LittleEndian.AppendUint64(nil, ntensors))
		b.Write(binary.LittleEndian.AppendUint64(nil, nkv))
		return &b
	}
	arrays := header(0, 1)
	arrays.Write(binary.LittleEndian.AppendUint64(nil, 1))
	arrays.WriteString("k")
	arrays.Write(binary.LittleEndian.AppendUint32(nil, uint32(TypeArray)))
	arrays.Write(binary.LittleEndian.AppendUint32(nil, uint32(TypeString)))
	arrays.Write(binary.LittleEndian.AppendUint64(nil, MaxArray-1))
	arrays.Write(make([]byte, 64))
	tensors := header(MaxTensors-1, 0)
	tensors.Write(make([]byte, 64))
	for name, b := range map[string][]byte{"array": arrays.Bytes(), "tensors": tensors.Bytes()} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Read(bytes.NewReader(b), int64(len(b)))
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v; want ErrFormat", name, err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("%s: Read of %d bytes allocated %d bytes", name, len(b), n)
		}
	}
}

// readTokenizer writes a GGUF file of kv (no tensors) and returns what
// Tokenizer reads from it.
func readTokenizer(t *testing.T, kv []KV) (*Tokenizer, error) {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, kv, nil, 0); err != nil {
		t.Fatal(err)
	}
	f, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	return f.Tokenizer()
}
