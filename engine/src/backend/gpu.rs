//! Finding a GPU: what `--backend auto` asks before it picks a backend.
//!
//! With the `cuda` feature the probe loads the CUDA driver, NVRTC and cuBLAS
//! libraries at run time (cudarc's dynamic loading: nothing CUDA is needed
//! to build) and asks for a device; cudarc panics rather than erroring when
//! a library is missing, so each library's presence is checked first.
//! Without the feature the probe says so. `unsafe` is confined to this
//! module.

/// A GPU the probe found.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub memory_bytes: usize,
}

/// The first GPU, or why there is none.
#[cfg(feature = "cuda")]
pub fn probe() -> Result<Device, String> {
    use cudarc::driver::CudaContext;
    // SAFETY: each `is_culib_present` only tries to load its shared library
    // and resolve its symbols; it touches no CUDA state and has no
    // preconditions.
    let present = unsafe {
        [
            ("the CUDA driver library (libcuda)", cudarc::driver::sys::is_culib_present()),
            ("NVRTC (libnvrtc)", cudarc::nvrtc::sys::is_culib_present()),
            ("cuBLAS (libcublas)", cudarc::cublas::sys::is_culib_present()),
        ]
    };
    if let Some((missing, _)) = present.iter().find(|(_, ok)| !ok) {
        return Err(format!("{missing} could not be loaded"));
    }
    let count = CudaContext::device_count().map_err(|e| format!("counting CUDA devices: {e}"))?;
    if count < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("opening CUDA device 0: {e}"))?;
    Ok(Device {
        ordinal: 0,
        name: ctx.name().map_err(|e| e.to_string())?,
        compute_capability: ctx.compute_capability().map_err(|e| e.to_string())?,
        memory_bytes: ctx.total_mem().map_err(|e| e.to_string())?,
    })
}

/// The first GPU, or why there is none.
#[cfg(not(feature = "cuda"))]
pub fn probe() -> Result<Device, String> {
    Err("this engine was built without the `cuda` feature".into())
}
