// Package evolve will own the search for faster WGSL kernel variants per
// device: parametric templates, an evolutionary loop under a time budget,
// lineage and a Pareto front, with winners passed through the kernels
// package's gate and endorsement. See DESIGN.md. Not built yet: this file
// only fixes the package's place in the layout.
package evolve
