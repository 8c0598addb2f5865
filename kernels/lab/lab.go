package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/kernels"
)

// Lab runs the correctness gate and the benchmark in this process, on one
// device: kernels.Gate and kernels.Bench. A kernel that never finishes
// leaves the device busy for good (lavapipe has no watchdog, and a GPU's
// may take seconds), so after a time limit the Lab refuses further work;
// Isolated runs each call in a child process instead, which is what
// anything facing a peer's WGSL should use. Not safe for concurrent use.
type Lab struct {
	Dev *gpu.Device
	// Timeout bounds each submission (and its read-back): 0 means 10 s. A
	// submission past it rejects the variant and breaks the Lab.
	Timeout time.Duration
	// Slack divides the roofline floor: a dispatch faster than Slack times
	// the time its bytes take at the copy bandwidth measured in the same
	// run is refused. 0 means 4 (caches can make a small op beat a copy of
	// the same bytes, but not by that much).
	Slack float64
	// Budget bounds the timed part of one Compare: runs are cut (never
	// below kernels.MinRuns) to fit. 0 means 60 s.
	Budget time.Duration
	Log    *slog.Logger // nil: discard

	broken error
}

// ErrTimeLimit is wrapped (with kernels.ErrGate) when a variant's
// dispatch runs past the time limit.
var ErrTimeLimit = errors.New("lab: kernel ran past the time limit")

// ErrBroken is returned by a Lab after a time limit or a lost device.
var ErrBroken = errors.New("lab: device unusable after an earlier kernel")

// guard is the size of the guard zones around every buffer: one before
// the binding (the offset alignment) and one at the end inside it, so a
// kernel that reads past its shape reads the guard pattern and one that
// writes past it changes the guard.
const guard = 256

// Words of the guard pattern: the largest float (wins an argmax, overflows
// a sum of squares) and a NaN (poisons everything else).
const guardA, guardB = 0x7f7fffff, 0xffc0dead

// poison is what every output holds before a dispatch: a NaN, which as a
// u32 index is out of every range.
const poison = 0x7fc0dead

func (l *Lab) timeout() time.Duration {
	if l.Timeout > 0 {
		return l.Timeout
	}
	return 10 * time.Second
}

func (l *Lab) log() *slog.Logger {
	if l.Log != nil {
		return l.Log
	}
	return slog.New(slog.DiscardHandler)
}

func gateErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", kernels.ErrGate, fmt.Sprintf(format, args...))
}

// usable reports why the Lab can take no work.
func (l *Lab) usable() error {
	if l.broken != nil {
		return fmt.Errorf("%w: %v", ErrBroken, l.broken)
	}
	if l.Dev == nil {
		return fmt.Errorf("lab: no device")
	}
	return l.Dev.Err()
}

// wait runs f (a Sync or a Read) under the time limit. Past it, or on a
// lost device, the Lab is broken and the error wraps kernels.ErrGate.
func (l *Lab) wait(ctx context.Context, what string, f func(context.Context) error) error {
	tctx, cancel := context.WithTimeout(ctx, l.timeout())
	defer cancel()
	err := f(tctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		l.broken = fmt.Errorf("%s: %w", what, ErrTimeLimit)
		return fmt.Errorf("%w: %s: %w (%v)", kernels.ErrGate, what, ErrTimeLimit, l.timeout())
	case errors.Is(err, gpu.ErrDeviceLost):
		l.broken = err
		return fmt.Errorf("%w: %s: %w", kernels.ErrGate, what, err)
	}
	return fmt.Errorf("%w: %s: %w", kernels.ErrGate, what, err)
}

// harnessOf returns op's harness.
func harnessOf(op string) (harness, error) {
	h, ok := harnesses[op]
	if !ok {
		return h, fmt.Errorf("lab: op %s is not wired into the lab yet (it runs %v)", op, Ops())
	}
	return h, nil
}

// compile builds v's pipeline with the dispatch rule's constants (a
// problem's consts), which win over the variant's own as they do in gpu
// (the tile sizes the grid was computed with are the rule's, gpu/ops);
// a failure is the variant's.
func (l *Lab) compile(ctx context.Context, v *kernels.Artifact, consts map[string]float64) (*gpu.Pipeline, error) {
	k, err := v.Kernel()
	if err != nil {
		return nil, gateErr("%v", err)
	}
	if len(consts) > 0 {
		if k.Constants == nil {
			k.Constants = map[string]float64{}
		}
		maps.Copy(k.Constants, consts)
	}
	p, err := l.compileKernel(ctx, k)
	if err != nil {
		return nil, gateErr("%v", err)
	}
	return p, nil
}

// compileKernel compiles k on the lab's device; a device lost doing so
// breaks the lab.
func (l *Lab) compileKernel(ctx context.Context, k gpu.Kernel) (*gpu.Pipeline, error) {
	p, err := l.Dev.Compile(ctx, k)
	if errors.Is(err, gpu.ErrDeviceLost) {
		l.broken = err
	}
	return p, err
}

// pipeSet compiles and keeps the pipelines one variant's runs need: the
// variant, per set of constants, in place of its op's built-in, and the
// other built-ins of an op that runs in several dispatches.
type pipeSet struct {
	l *Lab
	v *kernels.Artifact
	m map[string]*gpu.Pipeline
}

func (l *Lab) pipeSet(v *kernels.Artifact) *pipeSet {
	return &pipeSet{l: l, v: v, m: map[string]*gpu.Pipeline{}}
}

func (ps *pipeSet) release() {
	for _, p := range ps.m {
		p.Release()
	}
}

// of returns the pipeline of each of p's dispatches.
func (ps *pipeSet) of(ctx context.Context, p *problem) ([]*gpu.Pipeline, error) {
	own := kernels.BuiltinOf(ps.v.Descriptor.Op)
	out := make([]*gpu.Pipeline, len(p.steps))
	for i, st := range p.steps {
		key := st.key()
		pipe := ps.m[key]
		if pipe == nil {
			var err error
			if st.kernel == own {
				pipe, err = ps.l.compile(ctx, ps.v, st.consts)
			} else {
				pipe, err = ps.l.compileBuiltin(ctx, st.kernel, st.consts)
			}
			if err != nil {
				return nil, err
			}
			ps.m[key] = pipe
		}
		out[i] = pipe
	}
	return out, nil
}

// compileBuiltin compiles a built-in kernel of gpu/ops (the steps of an
// op's runtime form that are not the op's own kernel): a failure is the
// lab's, not the variant's.
func (l *Lab) compileBuiltin(ctx context.Context, name string, consts map[string]float64) (*gpu.Pipeline, error) {
	k, err := ops.Builtin(name, consts)
	if err != nil {
		return nil, err
	}
	k.Name = "lab-" + name
	return l.compileKernel(ctx, k)
}

// record records p's dispatches over b's buffers with pipes (one each).
func record(batch *gpu.Batch, pipes []*gpu.Pipeline, p *problem, b *buffers) error {
	for i, st := range p.steps {
		regions := make([]gpu.Region, len(st.binds))
		for j, k := range st.binds {
			regions[j] = b.regions[k]
		}
		if err := batch.Dispatch(pipes[i], st.groups, st.params, regions...); err != nil {
			return err
		}
	}
	return nil
}

// constsKey names a set of constants (pipelines by constants).
func constsKey(c map[string]float64) string {
	names := slices.Sorted(maps.Keys(c))
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s=%v,", n, c[n])
	}
	return b.String()
}

// seeded returns the input stream of seed for op.
func seeded(seed uint64, op, what string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(op + "/" + what))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// buffers is one problem's buffers on the device, each with guard zones.
type buffers struct {
	bufs    []*gpu.Buffer
	regions []gpu.Region // the bindings: data then the tail guard
	sizes   []int
	// pristine holds an in-place binding's initial data (nil for the
	// others): copied over the binding before every dispatch.
	pristine []*gpu.Buffer
}

func (b *buffers) release() {
	for _, x := range b.bufs {
		x.Release()
	}
	for _, x := range b.pristine {
		x.Release()
	}
}

// restore records the copy of every in-place binding's initial data over
// the binding (its data, not its guards).
func (b *buffers) restore(batch *gpu.Batch, p *problem) error {
	for i, bd := range p.binds {
		if bd.inout {
			n := uint64(align4(bd.size))
			if err := batch.Copy(b.regions[i].(gpu.Span).Buffer().Sub(guard, n), b.pristine[i].Sub(0, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

func align4(n int) int { return (n + 3) &^ 3 }

// pattern returns n bytes of words from f(i).
func pattern(n int, f func(i int) uint32) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.LittleEndian.PutUint32(b[i:], f(i/4))
	}
	return b
}

func guardWord(i int) uint32 {
	if i%2 == 0 {
		return guardA
	}
	return guardB
}

// upload makes the buffers of p: guard pattern all over, then the inputs'
// data (outputs are poisoned, in-place bindings restored, before each
// dispatch). Outputs and in-place bindings come from shared when it is
// given (one set of outputs for several input sets).
func (l *Lab) upload(p *problem, shared *buffers) (*buffers, error) {
	b := &buffers{pristine: make([]*gpu.Buffer, len(p.binds))}
	for i, bd := range p.binds {
		if bd.inout {
			pb, err := l.Dev.Alloc(uint64(align4(bd.size)))
			if err != nil {
				b.release()
				return nil, err
			}
			b.pristine[i] = pb
			init := make([]byte, align4(bd.size))
			copy(init, bd.data)
			if err := l.Dev.Write(pb, init); err != nil {
				b.release()
				return nil, err
			}
		}
		if bd.written() && shared != nil {
			b.bufs = append(b.bufs, nil)
			b.regions = append(b.regions, shared.regions[i])
			b.sizes = append(b.sizes, bd.size)
			continue
		}
		total := guard + align4(bd.size) + guard
		buf, err := l.Dev.Alloc(uint64(total))
		if err != nil {
			b.release()
			return nil, err
		}
		b.bufs = append(b.bufs, buf)
		b.regions = append(b.regions, buf.Sub(guard, uint64(align4(bd.size)+guard)))
		b.sizes = append(b.sizes, bd.size)
		init := pattern(total, guardWord)
		if !bd.written() {
			copy(init[guard:], bd.data)
		}
		if err := l.Dev.Write(buf, init); err != nil {
			b.release()
			return nil, err
		}
	}
	return b, nil
}

// poisonOutputs writes the poison over every output's data (not its guards).
func (l *Lab) poisonOutputs(p *problem, b *buffers) error {
	for i, bd := range p.binds {
		if bd.output() {
			if err := l.Dev.Write(b.regions[i].(gpu.Span).Buffer().Sub(guard, uint64(align4(bd.size))), pattern(align4(bd.size), func(int) uint32 { return poison })); err != nil {
				return err
			}
		}
	}
	return nil
}

// readOutputs reads every output binding's buffer whole and checks its
// guards (both zones) and returns the data.
func (l *Lab) readOutputs(ctx context.Context, p *problem, b *buffers) (map[int][]byte, error) {
	out := map[int][]byte{}
	for i, bd := range p.binds {
		if !bd.written() {
			continue
		}
		buf := b.regions[i].(gpu.Span).Buffer()
		all := make([]byte, buf.Size())
		if err := l.wait(ctx, "read", func(ctx context.Context) error { return l.Dev.Read(ctx, buf, all) }); err != nil {
			return nil, err
		}
		n := align4(bd.size)
		full := pattern(len(all), guardWord)
		if !slices.Equal(all[:guard], full[:guard]) || !slices.Equal(all[guard+n:], full[guard+n:]) {
			return nil, gateErr("output %d: the guard bytes around it changed (a write out of bounds)", i)
		}
		out[i] = all[guard : guard+bd.size]
	}
	return out, nil
}

// run dispatches p once with pipes over its buffers from poisoned outputs
// and checks the result. It returns the worst error in tolerance units.
func (l *Lab) run(ctx context.Context, pipes []*gpu.Pipeline, p *problem, b *buffers) (float64, error) {
	if err := l.poisonOutputs(p, b); err != nil {
		return 0, err
	}
	batch := l.Dev.Batch()
	if err := b.restore(batch, p); err != nil {
		batch.Drop()
		return 0, err
	}
	if err := record(batch, pipes, p, b); err != nil {
		batch.Drop()
		return 0, gateErr("%v", err)
	}
	if err := batch.Submit(ctx); err != nil {
		return 0, gateErr("%v", err)
	}
	if err := l.wait(ctx, "dispatch", l.Dev.Sync); err != nil {
		return 0, err
	}
	out, err := l.readOutputs(ctx, p, b)
	if err != nil {
		return 0, err
	}
	e, err := p.check(out)
	if err != nil {
		return e, gateErr("%v", err)
	}
	return e, nil
}

// Check is the correctness gate (kernels.Gate): v on the op's fixed
// shapes and one random shape, inputs drawn from seed, outputs poisoned
// before each dispatch and guarded on both sides, every output compared
// with the float64 reference. MaxError is in multiples of the op's
// tolerance (Tolerance is 1).
func (l *Lab) Check(ctx context.Context, v *kernels.Artifact, seed uint64) (kernels.GateReport, error) {
	rep := kernels.GateReport{Seed: seed}
	if err := l.usable(); err != nil {
		return rep, err
	}
	h, err := harnessOf(v.Descriptor.Op)
	if err != nil {
		return rep, err
	}
	ps := l.pipeSet(v)
	defer ps.release()
	rng := seeded(seed, v.Descriptor.Op, "gate")
	shapes := append(slices.Clone(h.gateShapes), h.random(rng))
	for _, dims := range shapes {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		p, err := h.make(rng, dims)
		if err != nil {
			return rep, err
		}
		pipes, err := ps.of(ctx, p)
		if err != nil {
			return rep, err
		}
		b, err := l.upload(p, nil)
		if err != nil {
			return rep, err
		}
		e, err := l.run(ctx, pipes, p, b)
		b.release()
		rep.Shapes = append(rep.Shapes, kernels.GateShape{Dims: dims, MaxError: e, Tolerance: 1})
		if err != nil {
			return rep, fmt.Errorf("variant %s, %s %v: %w", v.CID, v.Descriptor.Op, dims, err)
		}
	}
	return rep, nil
}
