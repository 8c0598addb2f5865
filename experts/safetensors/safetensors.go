// Package safetensors reads and writes .safetensors files and the index of
// a sharded model (model.safetensors.index.json). The header is bounded
// and strictly checked; tensor data is given as sections of the file,
// never read into memory by the reader.
//
// Format: https://github.com/huggingface/safetensors (an 8-byte
// little-endian header length, a JSON header, then the data).
package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// MaxHeader bounds the JSON header (the format's own limit is 100 MB).
const MaxHeader = 100 << 20

// MaxDims bounds a tensor's rank.
const MaxDims = 8

// ErrFormat wraps every error about a malformed file.
var ErrFormat = errors.New("safetensors: malformed file")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// dtypeBits gives every dtype of the format its size in bits, to check any
// tensor's shape against its bytes; Supported says which ones convert.
var dtypeBits = map[string]uint64{"F64": 64, "F32": 32, "F16": 16, "BF16": 16, "I64": 64, "I32": 32,
	"I16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "U16": 16, "U32": 32,
	"U64": 64, "C64": 64, "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4}

// Tensor is one tensor of a file.
type Tensor struct {
	Name  string
	DType string
	Shape []uint64 // outermost first
	sec   *io.SectionReader
}

// Section returns the tensor's bytes as a section of the file.
func (t *Tensor) Section() *io.SectionReader { return t.sec }

// Size returns the tensor's bytes.
func (t *Tensor) Size() int64 { return t.sec.Size() }

// File is a parsed .safetensors file.
type File struct {
	Tensors  []*Tensor // in data order
	Metadata map[string]string
}

type entry struct {
	DType   string   `json:"dtype"`
	Shape   []uint64 `json:"shape"`
	Offsets []uint64 `json:"data_offsets"`
}

// Read parses the file in ra of size bytes. It refuses a header over
// MaxHeader, unknown dtypes, shapes whose bytes differ from their data
// range, ranges outside the data or overlapping, and data bytes that no
// tensor covers.
func Read(ra io.ReaderAt, size int64) (*File, error) {
	var lb [8]byte
	if _, err := ra.ReadAt(lb[:], 0); err != nil {
		return nil, formatErr("no header length: %v", err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n < 2 || n > MaxHeader || n > uint64(size)-8 {
		return nil, formatErr("header of %d bytes (file %d, limit %d)", n, size, MaxHeader)
	}
	hb := make([]byte, n)
	if _, err := ra.ReadAt(hb, 8); err != nil {
		return nil, formatErr("header: %v", err)
	}
	raw, err := objectFields(hb)
	if err != nil {
		return nil, formatErr("header: %v", err)
	}
	data := uint64(size) - 8 - n
	f := &File{}
	for _, field := range raw {
		name, msg := field.name, field.value
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &f.Metadata); err != nil {
				return nil, formatErr("__metadata__: %v", err)
			}
			continue
		}
		var e entry
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, formatErr("tensor %q: %v", name, err)
		}
		bitsPer, ok := dtypeBits[e.DType]
		if !ok {
			return nil, formatErr("tensor %q: unknown dtype %q", name, e.DType)
		}
		if len(e.Shape) > MaxDims || len(e.Offsets) != 2 || e.Offsets[0] > e.Offsets[1] || e.Offsets[1] > data {
			return nil, formatErr("tensor %q: shape %v, data_offsets %v (data is %d bytes)", name, e.Shape, e.Offsets, data)
		}
		cnt := bitsPer
		for _, d := range e.Shape {
			hi, lo := bits.Mul64(cnt, d)
			if hi != 0 || lo > 1<<62 {
				return nil, formatErr("tensor %q: shape %v too large", name, e.Shape)
			}
			cnt = lo
		}
		if cnt%8 != 0 || cnt/8 != e.Offsets[1]-e.Offsets[0] {
			return nil, formatErr("tensor %q: shape %v of %s is %d bits; data_offsets hold %d bytes", name, e.Shape, e.DType, cnt, e.Offsets[1]-e.Offsets[0])
		}
		f.Tensors = append(f.Tensors, &Tensor{Name: name, DType: e.DType, Shape: e.Shape,
			sec: io.NewSectionReader(ra, int64(8+n+e.Offsets[0]), int64(e.Offsets[1]-e.Offsets[0]))})
	}
	slices.SortStableFunc(f.Tensors, func(a, b *Tensor) int { return cmp.Compare(sectionStart(a), sectionStart(b)) })
	at := int64(8 + n)
	for _, t := range f.Tensors {
		s := sectionStart(t)
		if s < at {
			return nil, formatErr("tensor %q overlaps the one before it", t.Name)
		}
		if s > at {
			return nil, formatErr("%d data bytes before tensor %q belong to no tensor", s-at, t.Name)
		}
		at = s + t.Size()
	}
	if at != size {
		return nil, formatErr("%d data bytes at the end belong to no tensor", size-at)
	}
	return f, nil
}

func sectionStart(t *Tensor) int64 {
	_, off, _ := t.sec.Outer()
	return off
}

// Supported reports whether t's dtype can be converted (F32, F16, BF16).
func (t *Tensor) Supported() bool { return t.DType == "F32" || t.DType == "F16" || t.DType == "BF16" }

type field struct {
	name  string
	value json.RawMessage
}

// objectFields splits a JSON object into its fields, in order, refusing a
// name given twice (encoding/json would keep the last silently) and
// anything after the object but spaces.
func objectFields(b []byte) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var out []field
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, fmt.Errorf("%q twice", name)
		}
		seen[name] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, field{name, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("bytes after the header's object")
	}
	return out, nil
}

// WriteTensor is a tensor to write.
type WriteTensor struct {
	Name  string
	DType string
	Shape []uint64
	Data  []byte
}

// Write writes a .safetensors file (header padded with spaces to 8 bytes).
func Write(w io.Writer, tensors []WriteTensor, metadata map[string]string) error {
	hdr := map[string]any{}
	if metadata != nil {
		hdr["__metadata__"] = metadata
	}
	var off uint64
	for _, t := range tensors {
		shape := t.Shape
		if shape == nil {
			shape = []uint64{}
		}
		hdr[t.Name] = entry{t.DType, shape, []uint64{off, off + uint64(len(t.Data))}}
		off += uint64(len(t.Data))
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))); err != nil {
		return err
	}
	if _, err := w.Write(hb); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// Model is the tensors of a model directory: one model.safetensors, or the
// shards its model.safetensors.index.json names.
type Model struct {
	Tensors map[string]*Tensor
	Files   []*os.File
}

// Close closes the model's files.
func (m *Model) Close() error {
	var err error
	for _, f := range m.Files {
		err = errors.Join(err, f.Close())
	}
	return err
}

// OpenDir opens the safetensors files of a model directory. With an index
// file, every tensor must be in the file the index names, and every file
// it names must exist inside dir.
func OpenDir(dir string) (*Model, error) {
	m := &Model{Tensors: map[string]*Tensor{}}
	var files []string
	ib, err := readFileMax(filepath.Join(dir, "model.safetensors.index.json"), MaxHeader)
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	switch {
	case err == nil:
		if err := json.Unmarshal(ib, &index); err != nil {
			return nil, formatErr("model.safetensors.index.json: %v", err)
		}
		seen := map[string]bool{}
		for _, f := range index.WeightMap {
			if f != filepath.Base(f) || !strings.HasSuffix(f, ".safetensors") {
				return nil, formatErr("index names file %q (want a .safetensors file in the directory)", f)
			}
			if !seen[f] {
				seen[f] = true
				files = append(files, f)
			}
		}
		sort.Strings(files)
	case errors.Is(err, os.ErrNotExist):
		files, _ = filepath.Glob(filepath.Join(dir, "*.safetensors"))
		for i := range files {
			files[i] = filepath.Base(files[i])
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("%s: no .safetensors files", dir)
		}
	default:
		return nil, err
	}
	for _, name := range files {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			m.Close()
			return nil, err
		}
		m.Files = append(m.Files, f)
		fi, err := f.Stat()
		if err != nil {
			m.Close()
			return nil, err
		}
		sf, err := Read(f, fi.Size())
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for _, t := range sf.Tensors {
			if _, dup := m.Tensors[t.Name]; dup {
				m.Close()
				return nil, formatErr("tensor %q in two files", t.Name)
			}
			if index.WeightMap != nil && index.WeightMap[t.Name] != name {
				m.Close()
				return nil, formatErr("tensor %q is in %s; the index says %q", t.Name, name, index.WeightMap[t.Name])
			}
			m.Tensors[t.Name] = t
		}
	}
	for name := range index.WeightMap {
		if _, ok := m.Tensors[name]; !ok {
			m.Close()
			return nil, formatErr("the index names tensor %q, which no file holds", name)
		}
	}
	return m, nil
}

// readFileMax reads a whole file of at most max bytes, refusing a larger
// one before reading it.
func readFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, formatErr("%s is over %d bytes", filepath.Base(path), max)
	}
	return b, nil
}
