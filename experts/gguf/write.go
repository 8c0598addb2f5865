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

// Write writes a GGUF v3 file with the given metadata and tensors, their
// data aligned to alignment (general.alignment is written when it is not
// the default). Used to make test files and by tools; it checks that each
// tensor's bytes match its dims and type where the type's size is known.
func Write(w io.Writer, kv []KV, tensors []WriteTensor, alignment uint64) error {
	if alignment == 0 {
		alignment = DefaultAlignment
	}
	if alignment&(alignment-1) != 0 || alignment > MaxAlignment {
		return fmt.Errorf("gguf: alignment %d is not a power of two up to %d", alignment, MaxAlignment)
	}
	if alignment != DefaultAlignment {
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
		n := uint64(1)
		for _, d := range t.Dims {
			n *= d
		}
		if sz, err := t.Type.DataSize(n, t.Dims[0]); err == nil && sz != uint64(len(t.Data)) {
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

func (e *encoder) u32(v uint32) { e.raw(binary.LittleEndian.AppendUint32(nil, v)) }
func (e *encoder) u64(v uint64) { e.raw(binary.LittleEndian.AppendUint64(nil, v)) }
func (e *encoder) str(s string) { e.u64(uint64(len(s))); e.raw([]byte(s)) }

func (e *encoder) pad(alignment uint64) {
	if r := e.w.n % alignment; r != 0 {
		e.raw(make([]byte, alignment-r))
	}
}

// value writes v, preceded by its type when typed is set.
func (e *encoder) value(v any, typed bool) {
	t := func(vt ValueType) {
		if typed {
			e.u32(uint32(vt))
		}
	}
	switch v := v.(type) {
	case uint8:
		t(TypeUint8)
		e.raw([]byte{v})
	case int8:
		t(TypeInt8)
		e.raw([]byte{byte(v)})
	case uint16:
		t(TypeUint16)
		e.raw(binary.LittleEndian.AppendUint16(nil, v))
	case int16:
		t(TypeInt16)
		e.raw(binary.LittleEndian.AppendUint16(nil, uint16(v)))
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
		b := byte(0)
		if v {
			b = 1
		}
		e.raw([]byte{b})
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
		e.u32(uint32(v.Type))
		switch xs := v.Values.(type) {
		case []string:
			e.u64(uint64(len(xs)))
			for _, x := range xs {
				e.str(x)
			}
		case []float32:
			e.u64(uint64(len(xs)))
			for _, x := range xs {
				e.u32(math.Float32bits(x))
			}
		case []int32:
			e.u64(uint64(len(xs)))
			for _, x := range xs {
				e.u32(uint32(x))
			}
		case []uint32:
			e.u64(uint64(len(xs)))
			for _, x := range xs {
				e.u32(x)
			}
		case []any:
			e.u64(uint64(len(xs)))
			for _, x := range xs {
				e.value(x, false)
			}
		default:
			e.err = fmt.Errorf("gguf: array of %T", v.Values)
		}
	default:
		e.err = fmt.Errorf("gguf: metadata value of type %T", v)
	}
}
