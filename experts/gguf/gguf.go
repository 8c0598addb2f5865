// Package gguf reads and writes GGUF files (versions 2 and 3): the
// metadata, the tensor table and, as sections of the file, the tensor
// data. Every count, length, dimension and offset read from a file is
// bounded before anything is allocated from it; tensor data is never read
// into memory by the reader (Tensor.Section gives an io.SectionReader).
//
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
package gguf

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
)

// Magic opens every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// Limits of what Read accepts.
const (
	MaxTensors   = 1 << 20
	MaxKV        = 1 << 20
	MaxString    = 1 << 24 // one string's bytes
	MaxArray     = 1 << 26 // one array's elements
	MaxDims      = 4
	MaxAlignment = 1 << 16
)

// ErrFormat wraps every error about a malformed file.
var ErrFormat = errors.New("gguf: malformed file")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// ValueType is a metadata value's type.
type ValueType uint32

// The metadata value types.
const (
	TypeUint8 ValueType = iota
	TypeInt8
	TypeUint16
	TypeInt16
	TypeUint32
	TypeInt32
	TypeFloat32
	TypeBool
	TypeString
	TypeArray
	TypeUint64
	TypeInt64
	TypeFloat64
)

var scalarSize = [...]int{TypeUint8: 1, TypeInt8: 1, TypeUint16: 2, TypeInt16: 2, TypeUint32: 4, TypeInt32: 4,
	TypeFloat32: 4, TypeBool: 1, TypeString: 8, TypeArray: 12, TypeUint64: 8, TypeInt64: 8, TypeFloat64: 8}

// TensorType is a ggml_type.
type TensorType uint32

// The ggml types this package knows by name; only F32, F16, BF16 and
// Q4_K have a known size here (DataSize refuses the others).
const (
	F32  TensorType = 0
	F16  TensorType = 1
	Q4_0 TensorType = 2
	Q4_1 TensorType = 3
	Q5_0 TensorType = 6
	Q5_1 TensorType = 7
	Q8_0 TensorType = 8
	Q2_K TensorType = 10
	Q3_K TensorType = 11
	Q4_K TensorType = 12
	Q5_K TensorType = 13
	Q6_K TensorType = 14
	BF16 TensorType = 30
)

func (t TensorType) String() string {
	switch t {
	case F32:
		return "F32"
	case F16:
		return "F16"
	case Q4_0:
		return "Q4_0"
	case Q4_1:
		return "Q4_1"
	case Q5_0:
		return "Q5_0"
	case Q5_1:
		return "Q5_1"
	case Q8_0:
		return "Q8_0"
	case Q2_K:
		return "Q2_K"
	case Q3_K:
		return "Q3_K"
	case Q4_K:
		return "Q4_K"
	case Q5_K:
		return "Q5_K"
	case Q6_K:
		return "Q6_K"
	case BF16:
		return "BF16"
	}
	return fmt.Sprintf("ggml_type(%d)", uint32(t))
}

// DataSize returns the bytes of n elements whose innermost dimension is
// ne0, for the types this package supports.
func (t TensorType) DataSize(n, ne0 uint64) (uint64, error) {
	switch t {
	case F32:
		return n * 4, nil
	case F16, BF16:
		return n * 2, nil
	case Q4_K:
		if ne0%256 != 0 {
			return 0, fmt.Errorf("Q4_K rows of %d weights (want a multiple of 256)", ne0)
		}
		return n / 256 * 144, nil
	}
	return 0, fmt.Errorf("tensor type %s is not supported (F32, F16, BF16, Q4_K are)", t)
}

// KV is one metadata entry. Value holds uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64, or an
// Array.
type KV struct {
	Key   string
	Value any
}

// Array is a metadata array: its element type and the elements as a
// slice of that Go type ([]string, []float32, []int32, ...; arrays of
// arrays as []Array).
type Array struct {
	Type   ValueType
	Values any
}

// Tensor is one entry of the tensor table. Dims are GGML's ne: the
// innermost (contiguous) dimension first.
type Tensor struct {
	Name   string
	Dims   []uint64
	Type   TensorType
	Offset uint64 // from the start of the data section
	Size   uint64 // bytes (0 for an unsupported type)
	sec    *io.SectionReader
}

// Elements returns the number of elements.
func (t *Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Section returns the tensor's bytes as a section of the file.
func (t *Tensor) Section() *io.SectionReader { return t.sec }

// File is a parsed GGUF file.
type File struct {
	Version    uint32
	KV         []KV
	Tensors    []*Tensor
	Alignment  uint64
	DataOffset uint64 // where the data section starts
	kv         map[string]any
}

// Get returns the value of key.
func (f *File) Get(key string) (any, bool) {
	v, ok := f.kv[key]
	return v, ok
}

// Uint returns key's value as an unsigned integer, if it is one.
func (f *File) Uint(key string) (uint64, bool) {
	switch v := f.kv[key].(type) {
	case uint8:
		return uint64(v), true
	case uint16:
		return uint64(v), true
	case uint32:
		return uint64(v), true
	case uint64:
		return v, true
	case int8:
		return uint64(v), v >= 0
	case int16:
		return uint64(v), v >= 0
	case int32:
		return uint64(v), v >= 0
	case int64:
		return uint64(v), v >= 0
	}
	return 0, false
}

// Float returns key's value as a float, if it is a number.
func (f *File) Float(key string) (float64, bool) {
	switch v := f.kv[key].(type) {
	case float32:
		return float64(v), true
	case float64:
		return v, true
	}
	u, ok := f.Uint(key)
	return float64(u), ok
}

// String returns key's value if it is a string.
func (f *File) String(key string) (string, bool) {
	s, ok := f.kv[key].(string)
	return s, ok
}

// Strings returns key's value if it is an array of strings (the
// tokenizer's tokens and merges).
func (f *File) Strings(key string) ([]string, bool) {
	a, ok := f.kv[key].(Array)
	if !ok {
		return nil, false
	}
	s, ok := a.Values.([]string)
	return s, ok
}

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*Tensor, bool) {
	for _, t := range f.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return nil, false
}

// reader reads the header sequentially, tracking its position and the
// bytes left in the file.
type reader struct {
	br   *bufio.Reader
	pos  uint64
	size uint64
	err  error
}

func (r *reader) read(p []byte) {
	if r.err != nil {
		return
	}
	if uint64(len(p)) > r.size-r.pos {
		r.err = formatErr("truncated at byte %d", r.pos)
		return
	}
	if _, err := io.ReadFull(r.br, p); err != nil {
		r.err = fmt.Errorf("gguf: reading at byte %d: %w", r.pos, err)
		return
	}
	r.pos += uint64(len(p))
}

func (r *reader) u32() uint32 {
	var b [4]byte
	r.read(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (r *reader) u64() uint64 {
	var b [8]byte
	r.read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (r *reader) str() string {
	n := r.u64()
	if r.err != nil {
		return ""
	}
	if n > MaxString || n > r.size-r.pos {
		r.err = formatErr("string of %d bytes at byte %d", n, r.pos)
		return ""
	}
	b := make([]byte, n)
	r.read(b)
	return string(b)
}

// count reads an element count and bounds it by limit and by what the
// rest of the file can hold at minSize bytes each.
func (r *reader) count(what string, limit, minSize uint64) uint64 {
	n := r.u64()
	if r.err == nil && (n > limit || (minSize > 0 && n > (r.size-r.pos)/minSize)) {
		r.err = formatErr("%d %s at byte %d (limit %d, or more than the file holds)", n, what, r.pos, limit)
	}
	return n
}

func (r *reader) value(t ValueType, depth int) any {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		var b [1]byte
		r.read(b[:])
		switch t {
		case TypeUint8:
			return b[0]
		case TypeInt8:
			return int8(b[0])
		}
		if b[0] > 1 {
			r.err = formatErr("bool of value %d", b[0])
		}
		return b[0] == 1
	case TypeUint16, TypeInt16:
		var b [2]byte
		r.read(b[:])
		v := binary.LittleEndian.Uint16(b[:])
		if t == TypeInt16 {
			return int16(v)
		}
		return v
	case TypeUint32:
		return r.u32()
	case TypeInt32:
		return int32(r.u32())
	case TypeFloat32:
		return math.Float32frombits(r.u32())
	case TypeUint64:
		return r.u64()
	case TypeInt64:
		return int64(r.u64())
	case TypeFloat64:
		return math.Float64frombits(r.u64())
	case TypeString:
		return r.str()
	case TypeArray:
		if depth > 2 {
			r.err = formatErr("arrays nested deeper than 2")
			return nil
		}
		et := ValueType(r.u32())
		if r.err == nil && int(et) >= len(scalarSize) {
			r.err = formatErr("array of unknown type %d", et)
			return nil
		}
		n := r.count("array elements", MaxArray, uint64(scalarSize[et]))
		if r.err != nil {
			return nil
		}
		return Array{Type: et, Values: r.array(et, n, depth)}
	}
	r.err = formatErr("unknown value type %d at byte %d", t, r.pos)
	return nil
}

func (r *reader) array(et ValueType, n uint64, depth int) any {
	switch et {
	case TypeString:
		out := make([]string, 0, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			out = append(out, r.str())
		}
		return out
	case TypeFloat32:
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(r.u32())
		}
		return out
	case TypeInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(r.u32())
		}
		return out
	case TypeUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = r.u32()
		}
		return out
	}
	out := make([]any, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		out = append(out, r.value(et, depth+1))
	}
	return out
}

// Read parses the GGUF file in ra of size bytes. Tensor data is checked to
// lie inside the file, aligned and without overlap, but not read.
func Read(ra io.ReaderAt, size int64) (*File, error) {
	if size < 24 {
		return nil, formatErr("%d bytes is too short for a header", size)
	}
	r := &reader{br: bufio.NewReaderSize(io.NewSectionReader(ra, 0, size), 1<<16), size: uint64(size)}
	var magic [4]byte
	r.read(magic[:])
	if r.err == nil && string(magic[:]) != Magic {
		return nil, formatErr("magic %q (want %q)", magic[:], Magic)
	}
	f := &File{Version: r.u32(), kv: map[string]any{}}
	if r.err == nil && f.Version != 2 && f.Version != 3 {
		return nil, formatErr("version %d (want 2 or 3)", f.Version)
	}
	nt := r.count("tensors", MaxTensors, 8+4+8+4+8)
	nkv := r.count("metadata entries", MaxKV, 8+4+1)
	for i := uint64(0); i < nkv && r.err == nil; i++ {
		k := r.str()
		t := ValueType(r.u32())
		v := r.value(t, 0)
		if r.err != nil {
			break
		}
		if _, dup := f.kv[k]; dup {
			return nil, formatErr("metadata key %q twice", k)
		}
		f.kv[k] = v
		f.KV = append(f.KV, KV{k, v})
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.kv["general.alignment"]; ok {
		a, isU32 := v.(uint32)
		if !isU32 || a == 0 || a > MaxAlignment || a&(a-1) != 0 {
			return nil, formatErr("general.alignment %v (want a power of two up to %d, as uint32)", v, MaxAlignment)
		}
		f.Alignment = uint64(a)
	}
	names := map[string]bool{}
	for i := uint64(0); i < nt && r.err == nil; i++ {
		t := &Tensor{Name: r.str()}
		nd := r.u32()
		if r.err == nil && (nd == 0 || nd > MaxDims) {
			return nil, formatErr("tensor %q has %d dimensions (want 1 to %d)", t.Name, nd, MaxDims)
		}
		n := uint64(1)
		for j := uint32(0); j < nd && r.err == nil; j++ {
			d := r.u64()
			hi, lo := bits.Mul64(n, d)
			if d == 0 || hi != 0 || lo > 1<<50 {
				return nil, formatErr("tensor %q: dimension %d of %d", t.Name, j, d)
			}
			n = lo
			t.Dims = append(t.Dims, d)
		}
		t.Type = TensorType(r.u32())
		t.Offset = r.u64()
		if r.err != nil {
			break
		}
		if names[t.Name] {
			return nil, formatErr("tensor %q twice", t.Name)
		}
		names[t.Name] = true
		if t.Offset%f.Alignment != 0 {
			return nil, formatErr("tensor %q at data offset %d, not aligned to %d", t.Name, t.Offset, f.Alignment)
		}
		if sz, err := t.Type.DataSize(n, t.Dims[0]); err == nil {
			t.Size = sz
		}
		f.Tensors = append(f.Tensors, t)
	}
	if r.err != nil {
		return nil, r.err
	}
	f.DataOffset = (r.pos + f.Alignment - 1) / f.Alignment * f.Alignment
	// Data: inside the file, no overlaps.
	type span struct{ lo, hi uint64 }
	spans := make([]span, 0, len(f.Tensors))
	for _, t := range f.Tensors {
		if t.Offset > uint64(size) || f.DataOffset+t.Offset+t.Size > uint64(size) {
			return nil, formatErr("tensor %q: data [%d, +%d) past the end of the file (%d bytes)", t.Name, f.DataOffset+t.Offset, t.Size, size)
		}
		t.sec = io.NewSectionReader(ra, int64(f.DataOffset+t.Offset), int64(t.Size))
		spans = append(spans, span{t.Offset, t.Offset + t.Size})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return nil, formatErr("tensor data overlaps at data offset %d", spans[i].lo)
		}
	}
	return f, nil
}
