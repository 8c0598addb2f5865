package gpu

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// A Variant stands in for a named kernel on one device: other WGSL with
// that kernel's ABI (its bindings, uniform block and dispatch rule, which
// the op library that dispatches the kernel fixes), such as a kernel
// variant the kernel lab activated. The variant is data: the runtime
// compiles it in place of Of's source whenever Of is compiled on the
// device.
type Variant struct {
	Of        Kernel             // the kernel it replaces (gpu/ops.Builtin gives the built-ins)
	Name      string             // names it in errors and labels; Of.Name+"@variant" when empty
	Source    string             // WGSL
	Entry     string             // entry point; "main" when empty
	Constants map[string]float64 // values for its override declarations
}

// variantTable is a device's variants by the name of the kernel they
// replace.
type variantTable struct {
	mu sync.Mutex
	by map[string]variantEntry
}

type variantEntry struct {
	v     Variant
	ofSrc string // the replaced kernel's own source: a Compile of other source under its name keeps that source
}

// variants returns d's variant table, made on first use when create.
func (d *Device) variants(create bool) *variantTable {
	d.varsMu.Lock()
	defer d.varsMu.Unlock()
	if d.vars == nil && create {
		d.vars = &variantTable{by: map[string]variantEntry{}}
	}
	return d.vars
}

// UseVariant makes v the kernel this device compiles wherever v.Of (by
// name and source) is asked for. It first compiles v with v.Of's ABI
// and returns the compile error (wrapping ErrCompile) if v does not
// build; then nothing changes.
//
// It takes effect for pipelines compiled after the call: an op library
// that already compiled v.Of keeps it until it is closed, so make a new
// one (gpu/ops.NewKernels) after changing variants. Safe for concurrent
// use.
func (d *Device) UseVariant(ctx context.Context, v Variant) error {
	if v.Of.Name == "" || v.Of.Source == "" {
		return &KernelError{Kernel: v.Name, Op: "compile", Err: fmt.Errorf("%w: variant replaces no kernel", ErrCompile)}
	}
	if v.Name == "" {
		v.Name = v.Of.Name + "@variant"
	}
	v.Constants = maps.Clone(v.Constants)
	p, err := d.Compile(ctx, Kernel{Name: v.Name, Source: v.Source, Entry: v.Entry, Constants: v.Constants,
		Bindings: v.Of.Bindings, Params: v.Of.Params})
	if err != nil {
		return err
	}
	p.Release()
	t := d.variants(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.by[v.Of.Name] = variantEntry{v: v, ofSrc: v.Of.Source}
	return nil
}

// UseOriginal makes the device compile the kernel name's own source again
// (for pipelines compiled after the call; see UseVariant).
func (d *Device) UseOriginal(name string) {
	if t := d.variants(false); t != nil {
		t.mu.Lock()
		delete(t.by, name)
		t.mu.Unlock()
	}
}

// ActiveVariants returns the name of the variant standing in for each
// kernel that has one.
func (d *Device) ActiveVariants() map[string]string {
	out := map[string]string{}
	if t := d.variants(false); t != nil {
		t.mu.Lock()
		for b, e := range t.by {
			out[b] = e.v.Name
		}
		t.mu.Unlock()
	}
	return out
}

// withVariant returns k, or the variant that stands in for it when k is a
// kernel (its name and its own source) that has one on d. The caller's
// constants win over the variant's: they belong to the dispatch rule
// (tile sizes the grid was computed with).
func (d *Device) withVariant(k Kernel) Kernel {
	t := d.variants(false)
	if t == nil {
		return k
	}
	t.mu.Lock()
	e, ok := t.by[k.Name]
	t.mu.Unlock()
	if !ok || k.Source != e.ofSrc {
		return k
	}
	consts := maps.Clone(e.v.Constants)
	if consts == nil && len(k.Constants) > 0 {
		consts = map[string]float64{}
	}
	maps.Copy(consts, k.Constants)
	return Kernel{Name: fmt.Sprintf("%s(%s)", k.Name, e.v.Name), Source: e.v.Source, Entry: e.v.Entry,
		Constants: consts, Bindings: k.Bindings, Params: k.Params}
}
