// Package experts owns RDRR models: the manifest (FORMAT.md) and its strict
// validation, a model as one collection in the store, deterministic
// synthetic models with real shapes (and a source that serves them without
// storing them), and the mount plan. Sub-packages gguf, safetensors and
// convert import the model files people have. The MoE decode loop and the
// expert pager are planned (DESIGN.md, "Experts").
package experts
