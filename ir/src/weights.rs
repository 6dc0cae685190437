//! Weights on disk: safetensors files beside `.gir` files.
