// Package convert turns the model files people have, a GGUF file or a
// directory of safetensors with its config.json, into an RDRR model:
// manifest.json and 64 MiB shards in which each expert's matrices are one
// contiguous range, never split. It streams: memory is bounded by one
// copy buffer and one row, whatever the input's size.
package convert

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/rdrr/peer/internal/atomicfile"
	"github.com/x448/float16"
	"github.com/zeebo/blake3"
	"golang.org/x/sync/errgroup"
)

// Options control a conversion.
type Options struct {
	// Quantize, when set, turns F32, F16 and BF16 matrices into Q4_K
	// (those whose rows are whole 256-weight blocks; norms and routers
	// keep their precision). Q4_K inputs always pass through unchanged.
	Quantize bool
	// Progress, if not nil, is told the bytes written.
	Progress experts.Progress
}

// tensor is one input tensor, under its RDRR name.
type tensor struct {
	name   string
	dtype  experts.DType // the input's
	out    experts.DType // what is written
	shape  []int64       // outermost first
	src    *io.SectionReader
	layer  int // of an expert; -1 otherwise
	expert int
	part   int // 0 gate, 1 up, 2 down
	size   int64
}

// ErrUnsupported: an input the converter cannot read (a tensor type, an
// architecture).
var ErrUnsupported = errors.New("convert: unsupported")

// Convert reads the model at in (a .gguf file, or a directory with
// config.json and *.safetensors) and writes an RDRR model into out.
func Convert(ctx context.Context, in, out string, opt Options) (*experts.Manifest, error) {
	var (
		m       *experts.Manifest
		tensors []*tensor
		closer  io.Closer
		err     error
	)
	if fi, serr := os.Stat(in); serr == nil && fi.IsDir() {
		m, tensors, closer, err = openSafetensors(in)
	} else {
		m, tensors, closer, err = openGGUF(in)
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	for _, t := range tensors {
		t.out = t.dtype
		if opt.Quantize && t.dtype != experts.Q4K && quantizable(t) {
			t.out = experts.Q4K
		}
		n := int64(1)
		for _, d := range t.shape {
			n *= d
		}
		if t.size, err = t.out.Bytes(n, t.shape[len(t.shape)-1]); err != nil {
			return nil, fmt.Errorf("tensor %s: %w", t.name, err)
		}
	}
	order(tensors)
	layout(m, tensors)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	if err := write(ctx, m, tensors, out, opt.Progress); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("convert: the result does not validate: %w", err)
	}
	mb, err := m.Encode()
	if err != nil {
		return nil, err
	}
	return m, atomicfile.Write(filepath.Join(out, experts.ManifestFile), mb, 0o644)
}

// quantizable: a matrix with whole Q4_K rows that is not a norm or a
// router.
var keepPrecision = regexp.MustCompile(`norm|mlp\.gate\.weight$`)

func quantizable(t *tensor) bool {
	return len(t.shape) == 2 && t.shape[1]%256 == 0 && !keepPrecision.MatchString(t.name)
}

// order sorts dense tensors first (embeddings, layers in order, the rest),
// then experts by layer, expert and part.
func order(ts []*tensor) {
	rank := func(t *tensor) (int, int, int, int, string) {
		if t.layer >= 0 {
			return 2, t.layer, t.expert, t.part, ""
		}
		l, ok := layerOf(t.name)
		switch {
		case t.name == "model.embed_tokens.weight":
			return 0, -1, 0, 0, t.name
		case ok:
			return 1, l, 0, 0, t.name
		}
		return 1, 1 << 30, 0, 0, t.name
	}
	sort.SliceStable(ts, func(i, j int) bool {
		a0, a1, a2, a3, a4 := rank(ts[i])
		b0, b1, b2, b3, b4 := rank(ts[j])
		switch {
		case a0 != b0:
			return a0 < b0
		case a1 != b1:
			return a1 < b1
		case a2 != b2:
			return a2 < b2
		case a3 != b3:
			return a3 < b3
		}
		return a4 < b4
	})
}

var layerRe = regexp.MustCompile(`^model\.layers\.(\d+)\.`)

func layerOf(name string) (int, bool) {
	mm := layerRe.FindStringSubmatch(name)
	if mm == nil {
		return 0, false
	}
	l, err := strconv.Atoi(mm[1])
	return l, err == nil
}

// layout places the tensors (already ordered) in shards and fills the
// manifest's tensors, shards and experts index.
func layout(m *experts.Manifest, ts []*tensor) {
	var pk experts.Packer
	m.Tensors = map[string]*experts.Tensor{}
	for i := 0; i < len(ts); {
		t := ts[i]
		if t.layer < 0 {
			place(&pk, m, t)
			i++
			continue
		}
		// One expert: its parts, adjacent.
		j := i
		var size int64
		for j < len(ts) && ts[j].layer == t.layer && ts[j].expert == t.expert {
			size += ts[j].size
			j++
		}
		pk.Group(size)
		e := experts.Expert{Layer: t.layer, Index: t.expert, Size: size}
		for k := i; k < j; k++ {
			mt := place(&pk, m, ts[k])
			if k == i {
				e.Shard, e.Offset = mt.Shard, mt.Offset
			}
			e.Tensors = append(e.Tensors, ts[k].name)
		}
		m.Experts = append(m.Experts, e)
		i = j
	}
	m.Shards, m.TotalSize = pk.Shards()
}

func place(pk *experts.Packer, m *experts.Manifest, t *tensor) *experts.Tensor {
	sh, off := pk.Place(t.size)
	mt := &experts.Tensor{Shard: sh, Offset: off, Size: t.size, Shape: t.shape, DType: t.out}
	m.Tensors[t.name] = mt
	return mt
}

// shardWriter writes the model's byte space into shard files, one after
// the other, hashing each.
type shardWriter struct {
	dir    string
	m      *experts.Manifest
	i      int   // current shard
	left   int64 // bytes left in it
	f      *os.File
	h      *blake3.Hasher
	done   int64
	report experts.Progress
	syncs  errgroup.Group // shards being flushed while the next are written
}

func (w *shardWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if w.left == 0 {
			if err := w.next(); err != nil {
				return n, err
			}
		}
		k := int(min(int64(len(p)), w.left))
		if _, err := w.f.Write(p[:k]); err != nil {
			return n, err
		}
		w.h.Write(p[:k])
		w.left -= int64(k)
		w.done += int64(k)
		n += k
		p = p[k:]
	}
	if w.report != nil {
		w.report(w.done, w.m.TotalSize)
	}
	return n, nil
}

// next closes the current shard and opens the following one.
func (w *shardWriter) next() error {
	if err := w.finish(); err != nil {
		return err
	}
	if w.i >= len(w.m.Shards) {
		return errors.New("convert: more bytes than the layout holds")
	}
	s := &w.m.Shards[w.i]
	f, err := os.Create(filepath.Join(w.dir, s.Filename))
	if err != nil {
		return err
	}
	w.f, w.h, w.left = f, blake3.New(), s.Size
	return nil
}

// finish records the current shard's hash and flushes it to disk in the
// background (waiting for each flush before writing the next shard would
// leave the disk idle half the time); wait waits for every flush.
func (w *shardWriter) finish() error {
	if w.f == nil {
		return nil
	}
	if w.left != 0 {
		return fmt.Errorf("convert: shard %d is %d bytes short", w.i, w.left)
	}
	w.m.Shards[w.i].Hash = hex.EncodeToString(w.h.Sum(nil))
	f := w.f
	w.syncs.Go(func() error { return errors.Join(f.Sync(), f.Close()) })
	w.f = nil
	w.i++
	return nil
}

// wait finishes the last shard and waits until every shard is on disk.
func (w *shardWriter) wait() error {
	return errors.Join(w.finish(), w.syncs.Wait())
}

// write streams every tensor, in layout order, into the shards.
func write(ctx context.Context, m *experts.Manifest, ts []*tensor, dir string, report experts.Progress) error {
	sw := &shardWriter{dir: dir, m: m, report: report}
	sw.syncs.SetLimit(4)
	defer sw.syncs.Wait() // on an error too: no file left open
	buf := make([]byte, 4<<20)
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if t.out == t.dtype {
			_, err = io.CopyBuffer(sw, io.NewSectionReader(t.src, 0, t.src.Size()), buf)
		} else {
			err = quantize(sw, t)
		}
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.name, err)
		}
	}
	if err := sw.wait(); err != nil {
		return err
	}
	if sw.i != len(m.Shards) {
		return fmt.Errorf("convert: wrote %d of %d shards", sw.i, len(m.Shards))
	}
	return nil
}

// quantize writes t as Q4_K, one row at a time.
func quantize(w io.Writer, t *tensor) error {
	cols := t.shape[len(t.shape)-1]
	rows := t.src.Size() / (cols * elemSize(t.dtype))
	raw := make([]byte, cols*elemSize(t.dtype))
	row := make([]float32, cols)
	q := make([]byte, q4k.RowBytes(int(cols)))
	r := io.NewSectionReader(t.src, 0, t.src.Size())
	for i := int64(0); i < rows; i++ {
		if _, err := io.ReadFull(r, raw); err != nil {
			return err
		}
		toFloat32(row, raw, t.dtype)
		if err := q4k.Quantize(q, row); err != nil {
			return err
		}
		if _, err := w.Write(q); err != nil {
			return err
		}
	}
	return nil
}

func elemSize(d experts.DType) int64 {
	if d == experts.F32 {
		return 4
	}
	return 2
}

// toFloat32 decodes little-endian F32, F16 or BF16 values.
func toFloat32(dst []float32, src []byte, d experts.DType) {
	for i := range dst {
		switch d {
		case experts.F32:
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		case experts.F16:
			dst[i] = float16.Frombits(binary.LittleEndian.Uint16(src[2*i:])).Float32()
		case experts.BF16:
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	}
}
