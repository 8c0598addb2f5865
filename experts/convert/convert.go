// Package convert turns the model files people have, a GGUF file or a
// directory of safetensors with its config.json, into an RDRR model:
// manifest.json and 64 MiB shards in which each expert's matrices are one
// contiguous range, never split (an expert larger than a shard starts
// one). It streams: memory is one 4 MiB copy buffer, or one 4 MiB batch of
// rows being quantized by Options.Workers goroutines, whatever the input's
// size. Names are mapped to HuggingFace's (llama.cpp's GGUF names,
// Mixtral's block_sparse_moe experts) so that every model reads alike.
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
	"runtime"
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
	// Workers is how many goroutines quantize at once; 0 means GOMAXPROCS.
	// The output does not depend on it.
	Workers int
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
	if err := plan(tensors, opt.Quantize); err != nil {
		return nil, err
	}
	order(tensors)
	m.Quantization = string(dominant(tensors))
	layout(m, tensors)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if err := write(ctx, m, tensors, out, workers, opt.Progress); err != nil {
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

// plan decides each tensor's output dtype and size, and checks what the
// readers cannot: that no two input tensors map to one name and that each
// source holds exactly the bytes its shape and dtype say (so the writer
// never reads more, or less, than the layout reserved).
func plan(ts []*tensor, quantize bool) error {
	names := make(map[string]bool, len(ts))
	for _, t := range ts {
		if names[t.name] {
			return fmt.Errorf("convert: two input tensors are both %s", t.name)
		}
		names[t.name] = true
		t.out = t.dtype
		if quantize && t.dtype != experts.Q4K && quantizable(t) {
			t.out = experts.Q4K
		}
		if len(t.shape) == 0 || len(t.shape) > experts.MaxDims {
			return fmt.Errorf("tensor %s: shape %v (want 1 to %d dimensions)", t.name, t.shape, experts.MaxDims)
		}
		n := int64(1)
		for _, d := range t.shape {
			if d <= 0 || d > experts.MaxDim || n > math.MaxInt64/4/d {
				return fmt.Errorf("tensor %s: shape %v", t.name, t.shape)
			}
			n *= d
		}
		in, err := t.dtype.Bytes(n, t.shape[len(t.shape)-1])
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.name, err)
		}
		if in != t.src.Size() {
			return fmt.Errorf("tensor %s: shape %v of %s is %d bytes; the source holds %d", t.name, t.shape, t.dtype, in, t.src.Size())
		}
		if t.size, err = t.out.Bytes(n, t.shape[len(t.shape)-1]); err != nil {
			return fmt.Errorf("tensor %s: %w", t.name, err)
		}
	}
	return nil
}

// dominant returns the output dtype that holds the most bytes: the
// manifest's (informative) quantization.
func dominant(ts []*tensor) experts.DType {
	bytes := map[experts.DType]int64{}
	best := experts.Q4K
	for _, t := range ts {
		bytes[t.out] += t.size
		if bytes[t.out] > bytes[best] {
			best = t.out
		}
	}
	return best
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

// number parses a layer or expert number from a tensor name, refusing
// one at or above limit (a name is input: "blk.99999999999999999999" must
// not wrap to 0 and collide with layer 0).
func number(tensorName, s string, limit int) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= limit {
		return 0, fmt.Errorf("tensor %s: number %s (limit %d)", tensorName, s, limit)
	}
	return n, nil
}

// setExpert marks t as part of expert e of layer l.
func (t *tensor) setExpert(origName, l, e string, part int) error {
	var err error
	if t.layer, err = number(origName, l, experts.MaxLayers); err != nil {
		return err
	}
	if t.expert, err = number(origName, e, experts.MaxExperts); err != nil {
		return err
	}
	t.part = part
	t.name = expertName(t.layer, t.expert, part)
	return nil
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
func write(ctx context.Context, m *experts.Manifest, ts []*tensor, dir string, workers int, report experts.Progress) error {
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
			err = quantize(ctx, sw, t, workers)
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

// quantBatch bounds the input bytes of one batch of rows being quantized.
const quantBatch = 4 << 20

// quantize writes t as Q4_K. Rows are read in batches of at most
// quantBatch input bytes; each of workers goroutines quantizes a
// contiguous run of the batch's rows, and the batch is written in order.
// Memory: one batch in, its Q4_K out, and one float32 row per worker.
func quantize(ctx context.Context, w io.Writer, t *tensor, workers int) error {
	cols := t.shape[len(t.shape)-1]
	rowIn, rowOut := cols*elemSize(t.dtype), int64(q4k.RowBytes(int(cols)))
	rows := t.src.Size() / rowIn
	batch := max(1, min(rows, quantBatch/rowIn))
	raw := make([]byte, batch*rowIn)
	out := make([]byte, batch*rowOut)
	floats := make([][]float32, workers)
	for k := range floats {
		floats[k] = make([]float32, cols)
	}
	r := io.NewSectionReader(t.src, 0, t.src.Size())
	for done := int64(0); done < rows; {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(batch, rows-done)
		if _, err := io.ReadFull(r, raw[:n*rowIn]); err != nil {
			return err
		}
		per := (n + int64(workers) - 1) / int64(workers)
		var g errgroup.Group
		for k := int64(0); k*per < n; k++ {
			row := floats[k]
			g.Go(func() error {
				for i := k * per; i < min(n, (k+1)*per); i++ {
					toFloat32(row, raw[i*rowIn:(i+1)*rowIn], t.dtype)
					if err := q4k.Quantize(out[i*rowOut:(i+1)*rowOut], row); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		if _, err := w.Write(out[:n*rowOut]); err != nil {
			return err
		}
		done += n
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
