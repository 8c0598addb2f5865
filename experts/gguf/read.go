package gguf

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
)

// reader reads the header sequentially, tracking its position. limit is
// where the header must end: the file's size or MaxHeader, whichever is
// smaller, so every count can be bounded by the bytes left before it.
type reader struct {
	br    *bufio.Reader
	pos   uint64
	limit uint64
	err   error
}

func (r *reader) left() uint64 { return r.limit - r.pos }

func (r *reader) read(p []byte) {
	if r.err != nil {
		return
	}
	if uint64(len(p)) > r.left() {
		r.err = formatErr("truncated header at byte %d (header limit %d)", r.pos, r.limit)
		return
	}
	if _, err := io.ReadFull(r.br, p); err != nil {
		r.err = fmt.Errorf("gguf: reading at byte %d: %w", r.pos, err)
		return
	}
	r.pos += uint64(len(p))
}

func (r *reader) u8() uint8 {
	var b [1]byte
	r.read(b[:])
	return b[0]
}

func (r *reader) u16() uint16 {
	var b [2]byte
	r.read(b[:])
	return binary.LittleEndian.Uint16(b[:])
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

func (r *reader) boolean() bool {
	b := r.u8()
	if r.err == nil && b > 1 {
		r.err = formatErr("bool of value %d at byte %d", b, r.pos-1)
	}
	return b == 1
}

func (r *reader) str() string {
	n := r.u64()
	if r.err != nil {
		return ""
	}
	if n > MaxString || n > r.left() {
		r.err = formatErr("string of %d bytes at byte %d (limit %d, or past the header)", n, r.pos, MaxString)
		return ""
	}
	b := make([]byte, n)
	r.read(b)
	return string(b)
}

// count reads an element count and bounds it by limit and by what the
// rest of the header can hold at minSize bytes each.
func (r *reader) count(what string, limit, minSize uint64) uint64 {
	n := r.u64()
	if r.err == nil && (n > limit || n > r.left()/minSize) {
		r.err = formatErr("%d %s at byte %d (limit %d, or more than the header holds)", n, what, r.pos, limit)
	}
	return n
}

func (r *reader) valueType() ValueType {
	t := ValueType(r.u32())
	if r.err == nil && int(t) >= len(minSize) {
		r.err = formatErr("unknown value type %d at byte %d", uint32(t), r.pos-4)
	}
	return t
}

func (r *reader) value(t ValueType, depth int) any {
	switch t {
	case TypeUint8:
		return r.u8()
	case TypeInt8:
		return int8(r.u8())
	case TypeBool:
		return r.boolean()
	case TypeUint16:
		return r.u16()
	case TypeInt16:
		return int16(r.u16())
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
		return r.array(depth)
	}
	r.err = formatErr("unknown value type %d", uint32(t))
	return nil
}

// elems reads n elements with one; n is already bounded by the bytes left.
func elems[T any](r *reader, n uint64, one func() T) []T {
	out := make([]T, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		out = append(out, one())
	}
	return out
}

func (r *reader) array(depth int) Array {
	if depth >= maxNesting {
		r.err = formatErr("arrays nested deeper than %d at byte %d", maxNesting, r.pos)
		return Array{}
	}
	et := r.valueType()
	if r.err != nil {
		return Array{}
	}
	n := r.count("array elements", MaxArray, minSize[et])
	if r.err != nil {
		return Array{}
	}
	a := Array{Type: et}
	switch et {
	case TypeUint8:
		a.Values = elems(r, n, r.u8)
	case TypeInt8:
		a.Values = elems(r, n, func() int8 { return int8(r.u8()) })
	case TypeBool:
		a.Values = elems(r, n, r.boolean)
	case TypeUint16:
		a.Values = elems(r, n, r.u16)
	case TypeInt16:
		a.Values = elems(r, n, func() int16 { return int16(r.u16()) })
	case TypeUint32:
		a.Values = elems(r, n, r.u32)
	case TypeInt32:
		a.Values = elems(r, n, func() int32 { return int32(r.u32()) })
	case TypeFloat32:
		a.Values = elems(r, n, func() float32 { return math.Float32frombits(r.u32()) })
	case TypeUint64:
		a.Values = elems(r, n, r.u64)
	case TypeInt64:
		a.Values = elems(r, n, func() int64 { return int64(r.u64()) })
	case TypeFloat64:
		a.Values = elems(r, n, func() float64 { return math.Float64frombits(r.u64()) })
	case TypeString:
		a.Values = elems(r, n, r.str)
	case TypeArray:
		a.Values = elems(r, n, func() Array { return r.array(depth + 1) })
	}
	return a
}

// Read parses the GGUF file in ra of size bytes: the header is read
// (bounded by MaxHeader) and every tensor's data is checked to lie inside
// the file, aligned, without overlap, but not read.
func Read(ra io.ReaderAt, size int64) (*File, error) {
	if size < 24 {
		return nil, formatErr("%d bytes is too short for a header", size)
	}
	r := &reader{br: bufio.NewReaderSize(io.NewSectionReader(ra, 0, size), 1<<16), limit: min(uint64(size), MaxHeader)}
	var magic [4]byte
	r.read(magic[:])
	if r.err == nil && string(magic[:]) != Magic {
		return nil, formatErr("magic %q (want %q)", magic[:], Magic)
	}
	f := &File{Version: r.u32(), kv: map[string]any{}, byName: map[string]*Tensor{}}
	if r.err == nil && f.Version != 2 && f.Version != 3 {
		if v := bits.ReverseBytes32(f.Version); v == 2 || v == 3 {
			return nil, formatErr("a big-endian GGUF v%d (only little-endian files are read)", v)
		}
		return nil, formatErr("version %d (want 2 or 3)", f.Version)
	}
	nt := r.count("tensors", MaxTensors, 8+4+8+4+8)
	nkv := r.count("metadata entries", MaxKV, 8+4+1)
	for i := uint64(0); i < nkv && r.err == nil; i++ {
		k := r.str()
		v := r.value(r.valueType(), 0)
		if r.err != nil {
			break
		}
		if _, dup := f.kv[k]; dup {
			return nil, formatErr("metadata key %q twice", k)
		}
		f.kv[k] = v
		f.KV = append(f.KV, KV{k, v})
	}
	if r.err != nil {
		return nil, r.err
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.kv["general.alignment"]; ok {
		a, isU32 := v.(uint32)
		if !isU32 || a == 0 || a > MaxAlignment || a&(a-1) != 0 {
			return nil, formatErr("general.alignment %v (want a power of two up to %d, as uint32)", v, MaxAlignment)
		}
		f.Alignment = uint64(a)
	}
	for i := uint64(0); i < nt && r.err == nil; i++ {
		t, err := r.tensorInfo(f.Alignment)
		if err != nil {
			return nil, err
		}
		if r.err != nil {
			break
		}
		if f.byName[t.Name] != nil {
			return nil, formatErr("tensor %q twice", t.Name)
		}
		f.byName[t.Name] = t
		f.Tensors = append(f.Tensors, t)
	}
	if r.err != nil {
		return nil, r.err
	}
	f.DataOffset = (r.pos + f.Alignment - 1) / f.Alignment * f.Alignment
	if err := f.locate(ra, uint64(size)); err != nil {
		return nil, err
	}
	return f, nil
}

// tensorInfo reads one entry of the tensor table and sizes its data.
func (r *reader) tensorInfo(alignment uint64) (*Tensor, error) {
	t := &Tensor{Name: r.str()}
	nd := r.u32()
	if r.err != nil {
		return t, nil
	}
	if nd == 0 || nd > MaxDims {
		return nil, formatErr("tensor %q has %d dimensions (want 1 to %d)", t.Name, nd, MaxDims)
	}
	n := uint64(1)
	for j := uint32(0); j < nd && r.err == nil; j++ {
		d := r.u64()
		hi, lo := bits.Mul64(n, d)
		if r.err == nil && (d == 0 || hi != 0 || lo > MaxElements) {
			return nil, formatErr("tensor %q: dimension %d of %d (want 1 up to %d elements in all)", t.Name, j, d, uint64(MaxElements))
		}
		n = lo
		t.Dims = append(t.Dims, d)
	}
	t.Type = TensorType(r.u32())
	t.Offset = r.u64()
	if r.err != nil {
		return t, nil
	}
	if !t.Type.Known() {
		return nil, formatErr("tensor %q has unknown type %d", t.Name, uint32(t.Type))
	}
	sz, err := t.Type.DataSize(n, t.Dims[0])
	if err != nil {
		return nil, formatErr("tensor %q: %v", t.Name, err)
	}
	t.Size = sz
	if t.Offset%alignment != 0 {
		return nil, formatErr("tensor %q at data offset %d, not aligned to %d", t.Name, t.Offset, alignment)
	}
	return t, nil
}

// locate gives each tensor its section of the file, after checking that
// it lies inside the file and overlaps no other.
func (f *File) locate(ra io.ReaderAt, size uint64) error {
	type span struct {
		lo, hi uint64
		name   string
	}
	spans := make([]span, 0, len(f.Tensors))
	for _, t := range f.Tensors {
		// DataOffset <= MaxHeader+MaxAlignment and Size <= 2^50 * 292/256
		// with Offset <= size: no sum overflows.
		if t.Offset > size || f.DataOffset+t.Offset+t.Size > size {
			return formatErr("tensor %q: data [%d, +%d) past the end of the file (%d bytes)", t.Name, f.DataOffset+t.Offset, t.Size, size)
		}
		t.sec = io.NewSectionReader(ra, int64(f.DataOffset+t.Offset), int64(t.Size))
		spans = append(spans, span{t.Offset, t.Offset + t.Size, t.Name})
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	for i := 1; i < len(spans); i++ {
		if spans[i].lo < spans[i-1].hi {
			return formatErr("tensors %q and %q overlap at data offset %d", spans[i-1].name, spans[i].name, spans[i].lo)
		}
	}
	return nil
}
