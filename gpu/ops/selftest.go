package ops

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/rdrr/peer/gpu/ref"
)

// SelfTestReport is what SelfTest found: whether the device computes the
// Q4_K kernels right, and how fast weights upload.
type SelfTestReport struct {
	Device       gpu.AdapterInfo `json:"device"`
	KnownBlocks  bool            `json:"knownBlocks"`  // hand-built GGML blocks dequantize exactly
	MatVec       bool            `json:"matvec"`       // a random Q4_K product matches the reference
	MatVecError  float64         `json:"matvecError"`  // worst error as a fraction of the tolerance
	UploadGBps   float64         `json:"uploadGBps"`   // 64 MiB through the staging ring, until the GPU has it
	WriteGBps    float64         `json:"writeGBps"`    // the same through queue.WriteBuffer
	MatVecMicros float64         `json:"matvecMicros"` // one 4096x4096 Q4_K product, submit to result
}

// SelfTest checks d on known inputs: hand-built GGML blocks (exact
// results), a random Q4_K matrix-vector product against the float64
// reference, and times a 64 MiB upload. It is a smoke test for a machine
// (peer gpu selftest), not a benchmark.
func SelfTest(ctx context.Context, d *gpu.Device) (SelfTestReport, error) {
	rep := SelfTestReport{Device: d.Info()}
	k := NewKernels(d)
	defer k.Close()

	blocks, want := q4k.KnownBlocks()
	got, err := selfDequant(ctx, d, k, blocks, len(want))
	if err != nil {
		return rep, err
	}
	rep.KnownBlocks = true
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			rep.KnownBlocks = false
			break
		}
	}

	const rows, cols = 4096, 4096
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	w := make([]byte, q4k.RowBytes(cols)*rows)
	for i := range w {
		w[i] = byte(r.Uint32())
	}
	for b := 0; b < len(w); b += q4k.BlockBytes {
		binary.LittleEndian.PutUint16(w[b:], q4k.ToF16(0.002))
		binary.LittleEndian.PutUint16(w[b+2:], q4k.ToF16(0.01))
	}
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	wb, err := d.Alloc(uint64(len(w)))
	if err != nil {
		return rep, err
	}
	defer wb.Release()
	xb, err := d.Alloc(uint64(4 * cols))
	if err != nil {
		return rep, err
	}
	defer xb.Release()
	yb, err := d.Alloc(uint64(4 * rows))
	if err != nil {
		return rep, err
	}
	defer yb.Release()
	if err := d.Upload(ctx, wb, w); err != nil {
		return rep, err
	}
	if err := d.Upload(ctx, xb, gpu.Bytes(x)); err != nil {
		return rep, err
	}
	var y []float32
	for i := 0; i < 3; i++ { // the first run compiles
		start := time.Now()
		b := d.Batch()
		if err := k.Q4KMatVec(ctx, b, wb, xb, yb, rows, cols); err != nil {
			return rep, err
		}
		if err := b.Submit(ctx); err != nil {
			return rep, err
		}
		y = make([]float32, rows)
		if err := d.Read(ctx, yb, gpu.Bytes(y)); err != nil {
			return rep, err
		}
		rep.MatVecMicros = float64(time.Since(start).Microseconds())
	}
	w64, err := ref.Q4K(w)
	if err != nil {
		return rep, err
	}
	wantY, mag := ref.MatMul(w64, ref.F32(x), rows, cols, 1)
	tol := ref.Tolerance(ref.OpMatMul)
	rep.MatVec = ref.Compare(y, wantY, mag, tol) == nil
	for i := range y {
		allowed := tol.Abs + tol.Rel*math.Max(math.Abs(wantY[i]), mag[i])
		rep.MatVecError = math.Max(rep.MatVecError, math.Abs(float64(y[i])-wantY[i])/allowed)
	}

	const n = 64 << 20
	src := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(src[i:], r.Uint64())
	}
	dst, err := d.Alloc(n)
	if err != nil {
		return rep, err
	}
	defer dst.Release()
	if err := d.Upload(ctx, dst, src); err != nil { // warm the staging ring
		return rep, err
	}
	timeIt := func(f func() error) (float64, error) {
		if err := d.Sync(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if err := d.Sync(ctx); err != nil {
			return 0, err
		}
		return n / time.Since(start).Seconds() / 1e9, nil
	}
	if rep.UploadGBps, err = timeIt(func() error { return d.Upload(ctx, dst, src) }); err != nil {
		return rep, err
	}
	if rep.WriteGBps, err = timeIt(func() error { return d.Write(dst, src) }); err != nil {
		return rep, err
	}
	if !rep.KnownBlocks || !rep.MatVec {
		return rep, fmt.Errorf("%w: self-test failed on %v (known blocks %v, matvec %v, worst error %.3gx the tolerance)",
			gpu.ErrValidation, rep.Device, rep.KnownBlocks, rep.MatVec, rep.MatVecError)
	}
	return rep, nil
}

func selfDequant(ctx context.Context, d *gpu.Device, k *Kernels, blocks []byte, n int) ([]float32, error) {
	w, err := d.Alloc(uint64(len(blocks)))
	if err != nil {
		return nil, err
	}
	defer w.Release()
	y, err := d.Alloc(uint64(4 * n))
	if err != nil {
		return nil, err
	}
	defer y.Release()
	if err := d.Upload(ctx, w, blocks); err != nil {
		return nil, err
	}
	b := d.Batch()
	if err := k.Q4KDequant(ctx, b, abi.F32, w, y, n); err != nil {
		return nil, err
	}
	if err := b.Submit(ctx); err != nil {
		return nil, err
	}
	out := make([]float32, n)
	return out, d.Read(ctx, y, gpu.Bytes(out))
}
