// Package gguf reads and writes GGUF files (versions 2 and 3): the
// metadata, the tensor table, the tokenizer and, as sections of the file,
// the tensor data. Every count, length, dimension and offset read from a
// file is bounded before anything is allocated or located from it; tensor
// data is never read into memory by the reader (Tensor.Section gives an
// io.SectionReader). It does not interpret weights: that is the
// converter's job (experts/convert).
//
// Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
package gguf

import (
	"errors"
	"fmt"
	"io"
)

// Magic opens every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// Limits of what Read accepts.
const (
	// MaxHeader bounds the bytes before the tensor data (metadata and
	// tensor table). A 128k-token tokenizer with its merges is about
	// 10 MB; what Read allocates is at most a small multiple of this.
	MaxHeader    = 256 << 20
	MaxTensors   = 1 << 20
	MaxKV        = 1 << 20
	MaxString    = 1 << 24 // one string's bytes
	MaxArray     = 1 << 26 // one array's elements
	MaxDims      = 4
	MaxElements  = 1 << 50 // one tensor's
	MaxAlignment = 1 << 16
	maxNesting   = 2 // arrays of arrays of arrays of scalars, at most
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

// minSize is the fewest bytes a value of each type takes in a file.
var minSize = [...]uint64{TypeUint8: 1, TypeInt8: 1, TypeUint16: 2, TypeInt16: 2, TypeUint32: 4, TypeInt32: 4,
	TypeFloat32: 4, TypeBool: 1, TypeString: 8, TypeArray: 12, TypeUint64: 8, TypeInt64: 8, TypeFloat64: 8}

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
	"string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("gguf_type(%d)", uint32(t))
}

// KV is one metadata entry. Value holds uint8, int8, uint16, int16,
// uint32, int32, float32, bool, string, uint64, int64, float64, or an
// Array.
type KV struct {
	Key   string
	Value any
}

// Array is a metadata array: its element type and the elements as a
// slice of that type's Go type ([]uint8, []int8, []uint16, []int16,
// []uint32, []int32, []float32, []bool, []string, []uint64, []int64,
// []float64, or []Array for arrays of arrays).
type Array struct {
	Type   ValueType
	Values any
}

// Len returns the number of elements.
func (a Array) Len() int {
	switch v := a.Values.(type) {
	case []uint8:
		return len(v)
	case []int8:
		return len(v)
	case []uint16:
		return len(v)
	case []int16:
		return len(v)
	case []uint32:
		return len(v)
	case []int32:
		return len(v)
	case []float32:
		return len(v)
	case []bool:
		return len(v)
	case []string:
		return len(v)
	case []uint64:
		return len(v)
	case []int64:
		return len(v)
	case []float64:
		return len(v)
	case []Array:
		return len(v)
	}
	return 0
}

// Tensor is one entry of the tensor table. Dims are GGML's ne: the
// innermost (contiguous) dimension first.
type Tensor struct {
	Name   string
	Dims   []uint64
	Type   TensorType
	Offset uint64 // from the start of the data section
	Size   uint64 // bytes
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

// Section returns the tensor's bytes as a section of the file. Reads
// through it are safe for concurrent use if the file's ReadAt is.
func (t *Tensor) Section() *io.SectionReader { return t.sec }

// File is a parsed GGUF file. Its tensors' sections read from the
// io.ReaderAt given to Read, which must stay open while they are used.
type File struct {
	Version    uint32
	KV         []KV // in file order
	Tensors    []*Tensor
	Alignment  uint64
	DataOffset uint64 // where the data section starts
	kv         map[string]any
	byName     map[string]*Tensor
}

// Get returns the value of key.
func (f *File) Get(key string) (any, bool) {
	v, ok := f.kv[key]
	return v, ok
}

// Uint returns key's value as an unsigned integer, if it is a
// non-negative integer.
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

// Strings returns key's value if it is an array of strings.
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
	t, ok := f.byName[name]
	return t, ok
}
