package lab

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/kernels"
)

// Activate makes d run the active variant of every op in reg that has
// one, loaded from s, in place of the op's built-in kernel (see
// gpu.Device.UseVariant; it takes effect for gpu/ops.Kernels made
// afterwards).
// The registry holds only variants this peer gated itself (Puller, `peer
// kernels use`); Activate still compiles each before it uses it and
// returns, joined, the errors of those it could not use (those ops keep
// their built-in kernel).
func Activate(ctx context.Context, d *gpu.Device, reg *kernels.Registry, s kernels.BlobReader) (map[string]string, error) {
	used := map[string]string{}
	var errs []error
	for op, v := range reg.ActiveAll() {
		if v == kernels.Builtin {
			continue
		}
		c, err := cas.ParseCID(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		a, err := kernels.Load(s, c)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		k, err := a.Kernel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		base, err := ops.Builtin(kernels.BuiltinOf(op), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		if err := d.UseVariant(ctx, gpu.Variant{Of: base, Name: k.Name, Source: k.Source,
			Entry: k.Entry, Constants: k.Constants}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", op, err))
			continue
		}
		used[op] = v
	}
	return used, errors.Join(errs...)
}
