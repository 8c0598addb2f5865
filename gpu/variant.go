package gpu

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// A Variant stands in for a built-in kernel on one device: other WGSL with
// the built-in's ABI (its bindings, uniform block and dispatch rule, which
// the call sites in kernels.go fix), such as a kernel variant the kernel
// lab activated. The variant is data: the runtime compiles it in place of
// the built-in's source whenever that built-in is compiled on the device.
type Variant struct {
	Builtin   string             // the built-in kernel it replaces (BuiltinNames)
	Name      string             // names it in errors and labels; Builtin+"@variant" when empty
	Source    string             // WGSL
	Entry     string             // entry point; "main" when empty
	Constants map[string]float64 // values for its override declarations
}

// variantTable is a device's variants by built-in name.
type variantTable struct {
	mu sync.Mutex
	by map[string]variantEntry
}

type variantEntry struct {
	v          Variant
	builtinSrc string // the built-in's own source: what a variant replaces
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

// UseVariant makes v the kernel this device compiles wherever the
// built-in v.Builtin is asked for. It first compiles v with the
// built-in's ABI and returns the compile error (wrapping ErrCompile) if v
// does not build; then nothing changes.
//
// It takes effect for pipelines compiled after the call: a Kernels that
// already compiled the built-in keeps it until it is closed, so make a new
// Kernels after changing variants. Safe for concurrent use.
func (d *Device) UseVariant(ctx context.Context, v Variant) error {
	base, err := Builtin(v.Builtin, nil)
	if err != nil {
		return err
	}
	if v.Name == "" {
		v.Name = v.Builtin + "@variant"
	}
	v.Constants = maps.Clone(v.Constants)
	p, err := d.Compile(ctx, Kernel{Name: v.Name, Source: v.Source, Entry: v.Entry, Constants: v.Constants,
		Bindings: base.Bindings, Params: base.Params})
	if err != nil {
		return err
	}
	p.Release()
	t := d.variants(true)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.by[v.Builtin] = variantEntry{v: v, builtinSrc: base.Source}
	return nil
}

// UseBuiltin makes the device compile the built-in kernel name again (for
// pipelines compiled after the call; see UseVariant).
func (d *Device) UseBuiltin(name string) {
	if t := d.variants(false); t != nil {
		t.mu.Lock()
		delete(t.by, name)
		t.mu.Unlock()
	}
}

// ActiveVariants returns the name of the variant standing in for each
// built-in that has one.
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
// built-in (its name and its own source) that has one on d. The call
// site's constants win over the variant's: they belong to the dispatch
// rule (tile sizes the grid was computed with).
func (d *Device) withVariant(k Kernel) Kernel {
	t := d.variants(false)
	if t == nil {
		return k
	}
	t.mu.Lock()
	e, ok := t.by[k.Name]
	t.mu.Unlock()
	if !ok || k.Source != e.builtinSrc {
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
