package gguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// WriteTensor is a tensor to write: its name, GGML dims (innermost
// first), type and bytes.
type WriteTensor struct {
	Name string
	Dims []uint64
	Type TensorType
	Data []byte
}

// Write writes a GGUF v3 file with the given metadata and tensors, each
// tensor's data aligned to alignment. With alignment 0 the alignment is
// kv's general.alignment, or DefaultAlignment; general.alignment is added
// to the metadata when the alignment is not the default and kv lacks it.
// Each tensor's bytes must match its dims and type. Used to make test
// files; it is not tuned for size.
func Write(w io.Writer, kv []KV, tensors []WriteTensor, alignment uint64) error {
	var inKV *uint32
	for _, x := range kv {
		if x.Key == "general.alignment" {
			a, ok := x.Value.(uint32)
			if !ok {
				return fmt.Errorf("gguf: general.alignment is a %T (want uint32)", x.Value)
			}
			inKV = &a
		}
	}
	switch {
	case alignment == 0 && inKV != nil:
		alignment = uint64(*inKV)
	case alignment == 0:
		alignment = DefaultAlignment
	case inKV != nil && uint64(*inKV) != alignment:
		return fmt.Errorf("gguf: alignment %d but general.alignment %d", alignment, *inKV)
	}
	if alignment == 0 || alignment&(alignment-1) != 0 || alignment > MaxAlignment {
		return fmt.Errorf("gguf: alignment %d is not a power of two up to %d", alignment, MaxAlignment)
	}
	if alignment != DefaultAlignment && inKV == nil {
		kv = append([]KV{{"general.alignment", uint32(alignment)}}, kv...)
	}
	bw := bufio.NewWriter(w)
	cw := &countWriter{w: bw}
	e := &encoder{w: cw}
	e.raw([]byte(Magic))
	e.u32(3)
	e.u64(uint64(len(tensors)))
	e.u64(uint64(len(kv)))
	for _, x := range kv {
		e.str(x.Key)
		e.value(x.Value, true)
	}
	var off uint64
	offs := make([]uint64, len(tensors))
	for i, t := range tensors {
		if len(t.Dims) == 0 || len(t.Dims) > MaxDims {
			return fmt.Errorf("gguf: tensor %q has %d dims (want 1 to %d)", t.Name, len(t.Dims), MaxDims)
		}
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		sz, err := t.Type.DataSize(n, t.Dims[0])
		if err != nil {
			return fmt.Errorf("gguf: tensor %q: %w", t.Name, err)
		}
		if sz != uint64(len(t.Data)) {
			return fmt.Errorf("gguf: tensor %q: %d bytes; dims %v of %s are %d", t.Name, len(t.Data), t.Dims, t.Type, sz)
		}
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		offs[i] = off
		off = (off + uint64(len(t.Data)) + alignment - 1) / alignment * alignment
	}
	e.pad(alignment)
	base := cw.n
	for i, t := range tensors {
		e.raw(make([]byte, base+offs[i]-cw.n))
		e.raw(t.Data)
	}
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

type countWriter struct {
	w io.Writer
	n uint64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

type encoder struct {
	w   *countWriter
	err error
}

func (e *encoder) raw(b []byte) {
	if e.err == nil {
		_, e.err = e.w.Write(b)
	}
}

func (e *encoder) u8(v uint8)   { e.raw([]byte{v}) }
func (e *encoder) u16(v uint16) { e.raw(binary.LittleEndian.AppendUint16(nil, v)) }
func (e *encoder) u32(v uint32) { e.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *encoder) u64(v uint64) { e.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.raw([]byte(s)) }

func (e *encoder) boolean(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *encoder) pad(alignment uint64) {
	if r := e.w.n % alignment; r != 0 {
		e.raw(make([]byte, alignment-r))
	}
}

// each writes v, which must be a []T, as a count and its elements, and
// reports whether it was one (if not, it writes an empty array).
func each[T any](e *encoder, v any, one func(T)) bool {
	xs, ok := v.([]T)
	e.u64(uint64(len(xs)))
	for _, x := range xs {
		one(x)
	}
	return ok
}

// value writes v, preceded by its type.
func (e *encoder) value(v any, typed bool) {
	t := func(vt ValueType) {
		if typed {
			e.u32(uint32(vt))
		}
	}
	switch v := v.(type) {
	case uint8:
		t(TypeUint8)
		e.u8(v)
	case int8:
		t(TypeInt8)
		e.u8(uint8(v))
	case uint16:
		t(TypeUint16)
		e.u16(v)
	case int16:
		t(TypeInt16)
		e.u16(uint16(v))
	case uint32:
		t(TypeUint32)
		e.u32(v)
	case int32:
		t(TypeInt32)
		e.u32(uint32(v))
	case float32:
		t(TypeFloat32)
		e.u32(math.Float32bits(v))
	case bool:
		t(TypeBool)
		e.boolean(v)
	case string:
		t(TypeString)
		e.str(v)
	case uint64:
		t(TypeUint64)
		e.u64(v)
	case int64:
		t(TypeInt64)
		e.u64(uint64(v))
	case float64:
		t(TypeFloat64)
		e.u64(math.Float64bits(v))
	case Array:
		t(TypeArray)
		e.array(v)
	default:
		e.err = fmt.Errorf("gguf: metadata value of type %T", v)
	}
}

func (e *encoder) array(a Array) {
	e.u32(uint32(a.Type))
	var ok bool
	v := a.Values
	switch a.Type {
	case TypeUint8:
		ok = each(e, v, e.u8)
	case TypeInt8:
		ok = each(e, v, func(x int8) { e.u8(uint8(x)) })
	case TypeUint16:
		ok = each(e, v, e.u16)
	case TypeInt16:
		ok = each(e, v, func(x int16) { e.u16(uint16(x)) })
	case TypeUint32:
		ok = each(e, v, e.u32)
	case TypeInt32:
		ok = each(e, v, func(x int32) { e.u32(uint32(x)) })
	case TypeFloat32:
		ok = each(e, v, func(x float32) { e.u32(math.Float32bits(x)) })
	case TypeBool:
		ok = each(e, v, e.boolean)
	case TypeString:
		ok = each(e, v, e.str)
	case TypeUint64:
		ok = each(e, v, e.u64)
	case TypeInt64:
		ok = each(e, v, func(x int64) { e.u64(uint64(x)) })
	case TypeFloat64:
		ok = each(e, v, func(x float64) { e.u64(math.Float64bits(x)) })
	case TypeArray:
		ok = each(e, v, e.array)
	}
	if !ok && e.err == nil {
		e.err = fmt.Errorf("gguf: array of %s holding %T", a.Type, a.Values)
	}
}
