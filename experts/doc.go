// Package experts will own the RDRR manifest, the Q4_K codec's use in model
// conversion (GGUF/safetensors import), deterministic synthetic models, and
// the MoE decode loop whose experts are paged in through tiers. See
// DESIGN.md, "RDRR model format" and "Experts". Not built yet: this file
// only fixes the package's place in the layout.
package experts
