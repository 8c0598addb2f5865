package gpu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cogentcore/webgpu/wgpu"
)

// Access says how a kernel uses a storage binding.
type Access uint8

const (
	ReadOnly  Access = iota // var<storage, read>
	ReadWrite               // var<storage, read_write>
)

func (a Access) String() string {
	if a == ReadWrite {
		return "read_write"
	}
	return "read"
}

// Kernel describes a compute shader and its ABI, in the form the kernel lab
// stores and exchanges (as a descriptor next to the WGSL blob):
//
//   - @group(0) @binding(i), i = 0..len(Bindings)-1: storage buffers, in
//     order, each declared var<storage, read> or var<storage, read_write>
//     as Bindings[i] says;
//   - @group(1) @binding(0): when Params > 0, a var<uniform> struct of
//     Params bytes with the dispatch's shape (bound with a dynamic offset,
//     so one buffer holds the parameters of every dispatch in a batch).
//
// Constants give values to `override` declarations. The binding cannot pass
// pipeline constants to wgpu, so Compile rewrites each `override NAME` into
// a `const` before compiling; every override must have a value or a default.
type Kernel struct {
	Name      string             // names the kernel in errors and labels
	Source    string             // WGSL
	Entry     string             // entry point; "main" when empty
	Constants map[string]float64 // values for override declarations
	Bindings  []Access           // group 0 storage bindings
	Params    int                // bytes of the group 1 uniform block; 0 = none
}

// key identifies a compiled pipeline: the WGSL's hash plus everything else
// that changes the result.
func (k Kernel) key() string {
	h := sha256.Sum256([]byte(k.Source))
	var b strings.Builder
	b.WriteString(hex.EncodeToString(h[:]))
	b.WriteString("|" + k.entry())
	names := make([]string, 0, len(k.Constants))
	for n := range k.Constants {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "|%s=%v", n, k.Constants[n])
	}
	fmt.Fprintf(&b, "|%s", layoutKey(k.Bindings, k.Params))
	return b.String()
}

func (k Kernel) entry() string {
	if k.Entry == "" {
		return "main"
	}
	return k.Entry
}

func layoutKey(bs []Access, params int) string {
	var b strings.Builder
	for _, a := range bs {
		b.WriteByte("rw"[a])
	}
	fmt.Fprintf(&b, "/p%d", params)
	return b.String()
}

// Pipeline is a compiled kernel. Pipelines are cached by Kernel.key and
// reference counted: Compile of an identical Kernel returns another handle
// to the same native pipeline.
type Pipeline struct {
	e        *pipeEntry
	released atomic.Bool
}

// Name is the kernel's name.
func (p *Pipeline) Name() string { return p.e.name }

type pipeEntry struct {
	d        *Device
	key      string
	name     string
	pipe     *wgpu.ComputePipeline
	layout   *layoutEntry
	bindings []Access
	params   int
	refs     int
	lastUse  uint64
}

// layoutEntry is the explicit layout shared by every kernel with the same
// bindings, so their bind groups are shared too.
type layoutEntry struct {
	key    string
	group0 *wgpu.BindGroupLayout
	group1 *wgpu.BindGroupLayout // nil without params
	pl     *wgpu.PipelineLayout
}

func (l *layoutEntry) release() {
	l.pl.Release()
	l.group0.Release()
	if l.group1 != nil {
		l.group1.Release()
	}
}

// Compile returns a pipeline for k, compiling it unless an identical one is
// cached. Errors wrap ErrCompile in a *KernelError naming k.Name, with
// wgpu's (naga's) message.
func (d *Device) Compile(ctx context.Context, k Kernel) (*Pipeline, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k = d.withVariant(k) // a variant that stands in for this kernel (variant.go)
	kerr := func(err error) error { return &KernelError{Kernel: k.Name, Op: "compile", Err: err} }
	if k.Name == "" {
		return nil, kerr(fmt.Errorf("%w: kernel has no name", ErrCompile))
	}
	if k.Params < 0 || k.Params > 256 || k.Params%4 != 0 {
		return nil, kerr(fmt.Errorf("%w: params block of %d bytes (want a multiple of 4, at most 256)", ErrCompile, k.Params))
	}
	if len(k.Bindings) == 0 || len(k.Bindings) > int(d.limits.MaxStorageBuffersPerShaderStage) {
		return nil, kerr(fmt.Errorf("%w: %d storage bindings (device allows 1..%d)", ErrCompile, len(k.Bindings), d.limits.MaxStorageBuffersPerShaderStage))
	}
	src, err := applyConstants(k.Source, k.Constants)
	if err != nil {
		return nil, kerr(fmt.Errorf("%w: %v", ErrCompile, err))
	}
	key := k.key()

	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return nil, kerr(err)
	}
	d.tick++
	if e, ok := d.pipes[key]; ok {
		e.refs++
		e.lastUse = d.tick
		return &Pipeline{e: e}, nil
	}
	layout, err := d.layoutLocked(k.Bindings, k.Params)
	if err != nil {
		return nil, kerr(err)
	}
	var mod *wgpu.ShaderModule
	var merr error
	ne := scoped(d.dev, func() {
		mod, merr = d.dev.CreateShaderModule(&wgpu.ShaderModuleDescriptor{
			Label:          k.Name,
			WGSLDescriptor: &wgpu.ShaderModuleWGSLDescriptor{Code: src},
		})
	})
	if ne != nil || merr != nil {
		if mod != nil {
			mod.Release()
		}
		if ne != nil {
			return nil, kerr(fmt.Errorf("%w: %w", ErrCompile, d.noteNative(ne)))
		}
		return nil, kerr(fmt.Errorf("%w: %v", ErrCompile, merr))
	}
	defer mod.Release()
	var pipe *wgpu.ComputePipeline
	var perr error
	ne = scoped(d.dev, func() {
		pipe, perr = d.dev.CreateComputePipeline(&wgpu.ComputePipelineDescriptor{
			Label:   k.Name,
			Layout:  layout.pl,
			Compute: wgpu.ProgrammableStageDescriptor{Module: mod, EntryPoint: k.entry()},
		})
	})
	if ne != nil || perr != nil {
		if pipe != nil {
			pipe.Release()
		}
		if ne != nil {
			return nil, kerr(fmt.Errorf("%w: %w", ErrCompile, d.noteNative(ne)))
		}
		return nil, kerr(fmt.Errorf("%w: %v", ErrCompile, perr))
	}
	e := &pipeEntry{d: d, key: key, name: k.Name, pipe: pipe, layout: layout,
		bindings: append([]Access(nil), k.Bindings...), params: k.Params, refs: 1, lastUse: d.tick}
	d.pipes[key] = e
	d.counters.pipelinesBuilt++
	d.trimPipelinesLocked()
	return &Pipeline{e: e}, nil
}

// Release drops this handle. The native pipeline stays cached while other
// handles exist or while it is among the Options.IdlePipelines most
// recently used idle ones. Work already submitted is unaffected.
// Release is idempotent.
func (p *Pipeline) Release() {
	if p == nil || !p.released.CompareAndSwap(false, true) {
		return
	}
	d := p.e.d
	d.mu.Lock()
	defer d.mu.Unlock()
	p.e.refs--
	d.trimPipelinesLocked()
}

func (d *Device) trimPipelinesLocked() {
	var idle []*pipeEntry
	for _, e := range d.pipes {
		if e.refs <= 0 {
			idle = append(idle, e)
		}
	}
	keep := max(d.opts.IdlePipelines, 0)
	if len(idle) <= keep {
		return
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].lastUse < idle[j].lastUse })
	for _, e := range idle[:len(idle)-keep] {
		delete(d.pipes, e.key)
		e.pipe.Release()
	}
}

func (d *Device) layoutLocked(bs []Access, params int) (*layoutEntry, error) {
	key := layoutKey(bs, params)
	if l, ok := d.layouts[key]; ok {
		return l, nil
	}
	l := &layoutEntry{key: key}
	entries := make([]wgpu.BindGroupLayoutEntry, len(bs))
	for i, a := range bs {
		t := wgpu.BufferBindingTypeReadOnlyStorage
		if a == ReadWrite {
			t = wgpu.BufferBindingTypeStorage
		}
		entries[i] = wgpu.BindGroupLayoutEntry{
			Binding:    uint32(i),
			Visibility: wgpu.ShaderStageCompute,
			Buffer:     wgpu.BufferBindingLayout{Type: t},
		}
	}
	var err error
	if l.group0, err = d.dev.CreateBindGroupLayout(&wgpu.BindGroupLayoutDescriptor{Label: key, Entries: entries}); err != nil {
		return nil, fmt.Errorf("%w: bind group layout: %v", ErrValidation, err)
	}
	groups := []*wgpu.BindGroupLayout{l.group0}
	if params > 0 {
		l.group1, err = d.dev.CreateBindGroupLayout(&wgpu.BindGroupLayoutDescriptor{Label: key + "/params", Entries: []wgpu.BindGroupLayoutEntry{{
			Binding:    0,
			Visibility: wgpu.ShaderStageCompute,
			Buffer: wgpu.BufferBindingLayout{
				Type:             wgpu.BufferBindingTypeUniform,
				HasDynamicOffset: true,
				MinBindingSize:   alignUp(uint64(params), 16),
			},
		}}})
		if err != nil {
			l.group0.Release()
			return nil, fmt.Errorf("%w: params layout: %v", ErrValidation, err)
		}
		groups = append(groups, l.group1)
	}
	if l.pl, err = d.dev.CreatePipelineLayout(&wgpu.PipelineLayoutDescriptor{Label: key, BindGroupLayouts: groups}); err != nil {
		l.group0.Release()
		if l.group1 != nil {
			l.group1.Release()
		}
		return nil, fmt.Errorf("%w: pipeline layout: %v", ErrValidation, err)
	}
	d.layouts[key] = l
	return l, nil
}

// Specialized returns the WGSL that Compile hands the device: k's source
// with every override declaration made a const of its value in
// k.Constants (else its default). Other WebGPU implementations (a
// browser's, Dawn) compile it as it is, where the raw source sizes
// arrays from overrides, which WGSL forbids.
func (k Kernel) Specialized() (string, error) { return applyConstants(k.Source, k.Constants) }

// overrideDecl matches `override NAME [: TYPE] [= EXPR];`.
var overrideDecl = regexp.MustCompile(`\boverride\s+([A-Za-z_][A-Za-z0-9_]*)\s*(?::\s*([A-Za-z0-9_<>]+))?\s*(?:=\s*([^;]+))?;`)

// applyConstants rewrites every override declaration of src into a const:
// with the value from consts when given, else with its default.
func applyConstants(src string, consts map[string]float64) (string, error) {
	seen := map[string]bool{}
	var firstErr error
	out := overrideDecl.ReplaceAllStringFunc(src, func(decl string) string {
		m := overrideDecl.FindStringSubmatch(decl)
		name, typ, def := m[1], m[2], strings.TrimSpace(m[3])
		seen[name] = true
		v, ok := consts[name]
		if !ok {
			if def == "" {
				if firstErr == nil {
					firstErr = fmt.Errorf("override %s has no default and no constant", name)
				}
				return decl
			}
			if typ == "" {
				return fmt.Sprintf("const %s = %s;", name, def)
			}
			return fmt.Sprintf("const %s: %s = %s;", name, typ, def)
		}
		lit, err := literal(typ, v)
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("constant %s: %v", name, err)
		}
		if typ == "" {
			return fmt.Sprintf("const %s = %s;", name, lit)
		}
		return fmt.Sprintf("const %s: %s = %s;", name, typ, lit)
	})
	if firstErr != nil {
		return "", firstErr
	}
	for n := range consts {
		if !seen[n] {
			return "", fmt.Errorf("constant %s is not an override in the source", n)
		}
	}
	return out, nil
}

func literal(typ string, v float64) (string, error) {
	switch typ {
	case "u32":
		if v < 0 || v > math.MaxUint32 || v != math.Trunc(v) {
			return "", fmt.Errorf("%v is not a u32", v)
		}
		return strconv.FormatUint(uint64(v), 10) + "u", nil
	case "i32":
		if v < math.MinInt32 || v > math.MaxInt32 || v != math.Trunc(v) {
			return "", fmt.Errorf("%v is not an i32", v)
		}
		return strconv.FormatInt(int64(v), 10) + "i", nil
	case "bool":
		return strconv.FormatBool(v != 0), nil
	case "f32":
		return "f32(" + strconv.FormatFloat(v, 'g', -1, 32) + ")", nil
	case "f16":
		return "f16(" + strconv.FormatFloat(v, 'g', -1, 32) + ")", nil
	case "":
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return strconv.FormatInt(int64(v), 10), nil
		}
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	}
	return "", fmt.Errorf("unsupported override type %s", typ)
}
