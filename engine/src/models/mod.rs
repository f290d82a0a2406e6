//! The models the engine runs, as host math: the synthetic transformer LM
//! ([`lm`], its kernels in [`math`], its words in [`vocab`]) and the
//! chunked video model ([`video`], which the diffusion jobs also run with
//! their own weights). The bottom layer of the engine: the GPU
//! implementations run these models' weights, the backends drive them, the
//! serving layers schedule them; nothing here knows of any of those.

pub mod lm;
#[allow(unsafe_code)]
pub mod math;
pub mod video;
pub mod vocab;
