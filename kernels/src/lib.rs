//! CUDA kernels of the engine's synthetic models, and their CPU references.
//!
//! This crate will hold the CUDA C sources (`*.cu`, compiled at run time with
//! NVRTC during engine warm-up) for what the models need beyond matrix
//! products: paged-KV attention, windowed chunk attention with block
//! sparsity, normalisation and activation, fp8-style quantise/dequantise and
//! frame decoding, each next to a CPU reference of the same math so GPU
//! results can be checked against CPU results.
//!
//! It is a skeleton so far: the engine's `emulated` backend needs no kernels.
//! The `cpu` backend (engine issue) and the `cuda` backend (CUDA issue) fill
//! it in. It has no dependencies, so it costs nothing to build.
