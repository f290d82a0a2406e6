//! [`kernels::Device`] on an NVIDIA GPU through cudarc (`cuda` feature):
//! the probe `--backend auto` asks, NVRTC compilation of `kernels/cuda`
//! for the device at start, launches through `cuLaunchKernel`, cuBLAS
//! `GemmEx` (bf16 inputs, fp32 accumulation), and offload/restore over
//! pinned host memory on a copy stream of its own.
//!
//! CUDA libraries are loaded at run time (nothing CUDA is needed to
//! build); cudarc panics rather than erroring when one is missing, so the
//! probe checks each library's presence first. All `unsafe` of the GPU
//! path is in this module, each block with its reasoning.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use kernels::{Arg, Device, DeviceError, Gemm, Result, BLOCK, KERNELS};

use super::GpuInfo;

fn err(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError(format!("{what}: {e}"))
}

/// The first GPU, or why there is none.
pub fn probe() -> std::result::Result<GpuInfo, String> {
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
    Ok(GpuInfo {
        ordinal: 0,
        name: ctx.name().map_err(|e| e.to_string())?,
        compute_capability: ctx.compute_capability().map_err(|e| e.to_string())?,
        memory_bytes: ctx.total_mem().map_err(|e| e.to_string())?,
    })
}

/// Whether NVRTC can be loaded (compiling needs no GPU).
pub fn nvrtc_present() -> bool {
    // SAFETY: only loads the library and resolves its symbols.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles kernels/cuda with NVRTC for compute capability `cc`; the PTX,
/// or NVRTC's log. Needs the NVRTC library, not a GPU.
pub fn compile_kernels(cc: (i32, i32)) -> std::result::Result<String, String> {
    if !nvrtc_present() {
        return Err("NVRTC (libnvrtc) could not be loaded".into());
    }
    let opts = CompileOptions { options: kernels::nvrtc_options(cc), ..Default::default() };
    compile_ptx_with_opts(kernels::source(), opts).map(|p| p.to_src()).map_err(|e| e.to_string())
}

/// Device memory, freed in stream order when dropped.
pub struct CudaBuf {
    ptr: CUdeviceptr,
    bytes: usize,
    stream: Arc<CudaStream>,
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `ptr` came from `malloc_async` on this stream and is freed
        // once, here; work issued before on the stream that uses it runs
        // first (stream order).
        let _ = unsafe { result::free_async(self.ptr, self.stream.cu_stream()) };
    }
}

impl CudaBuf {
    fn at(&self, offset: usize, len: usize) -> Result<CUdeviceptr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(self.ptr + offset as u64),
            _ => Err(DeviceError(format!(
                "{len} bytes at offset {offset} are outside a buffer of {} bytes",
                self.bytes
            ))),
        }
    }
}

/// Page-locked host memory.
pub struct PinnedHost {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the allocation is plain host memory owned by this value; the
// device writes it only between `offload` and `wait_copies`, which the
// owner sequences.
unsafe impl Send for PinnedHost {}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` and is freed once, here.
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

/// One GPU: a context, a compute stream, a copy stream, the compiled
/// kernels and a cuBLAS handle on the compute stream.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    blas: Mutex<CudaBlas>,
    name: String,
}

impl CudaDevice {
    /// Opens device `ordinal` and compiles every kernel for it with NVRTC
    /// (the engine is not ready before this has finished).
    pub fn open(ordinal: usize) -> Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(|e| err("opening the CUDA device", e))?;
        let cc = ctx.compute_capability().map_err(|e| err("reading the compute capability", e))?;
        let name = ctx.name().map_err(|e| err("reading the device name", e))?;
        let opts = CompileOptions { options: kernels::nvrtc_options(cc), ..Default::default() };
        let ptx = compile_ptx_with_opts(kernels::source(), opts)
            .map_err(|e| err("compiling kernels/cuda with NVRTC", e))?;
        let module = ctx.load_module(ptx).map_err(|e| err("loading the compiled kernels", e))?;
        let mut functions = HashMap::new();
        for k in KERNELS {
            functions.insert(k, module.load_function(k).map_err(|e| err(&format!("finding kernel {k}"), e))?);
        }
        // Batches allocate their work buffers stream-ordered from the
        // device's default pool; keep freed memory in the pool instead of
        // returning it to the driver at every synchronisation.
        ctx.bind_to_thread().map_err(|e| err("binding the CUDA context", e))?;
        let mut keep = u64::MAX;
        // SAFETY: `cu_device` is the context's own device; the release
        // threshold attribute takes a pointer to a u64, which `keep` is and
        // outlives the call.
        unsafe {
            let pool = result::device::get_default_mem_pool(ctx.cu_device())
                .map_err(|e| err("finding the default memory pool", e))?;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut keep as *mut u64 as *mut c_void,
            )
            .map_err(|e| err("setting the memory pool's release threshold", e))?;
        }
        let stream = ctx.new_stream().map_err(|e| err("creating the compute stream", e))?;
        let copy = ctx.new_stream().map_err(|e| err("creating the copy stream", e))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| err("creating the cuBLAS handle", e))?;
        Ok(Self { ctx, stream, copy, functions, blas: Mutex::new(blas), name })
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| err("binding the CUDA context", e))
    }

    /// Makes `waiter` wait for the work issued on `on` so far.
    fn order(&self, on: &CudaStream, waiter: &CudaStream) -> Result<()> {
        let ev = on.record_event(None).map_err(|e| err("recording an event", e))?;
        waiter.wait(&ev).map_err(|e| err("waiting for an event", e))
    }
}

impl Device for CudaDevice {
    type Buf = CudaBuf;
    type Host = PinnedHost;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn alloc(&self, bytes: usize) -> Result<CudaBuf> {
        self.bind()?;
        let s = self.stream.cu_stream();
        let size = bytes.max(1);
        // SAFETY: a fresh stream-ordered allocation of `size` bytes, zeroed
        // on the same stream before any use; freed by `CudaBuf::drop`.
        let ptr = unsafe {
            let ptr = result::malloc_async(s, size).map_err(|e| err("allocating device memory", e))?;
            result::memset_d8_async(ptr, 0, size, s).map_err(|e| err("zeroing device memory", e))?;
            ptr
        };
        Ok(CudaBuf { ptr, bytes, stream: Arc::clone(&self.stream) })
    }

    fn upload(&self, dst: &CudaBuf, offset: usize, src: &[u8]) -> Result<()> {
        self.bind()?;
        let p = dst.at(offset, src.len())?;
        // SAFETY: `p..p + src.len()` lies inside `dst` (checked); the copy is
        // synchronous with respect to `src` after the stream's prior work
        // because we synchronise before returning, so `src` may be dropped.
        unsafe {
            result::memcpy_htod_async(p, src, self.stream.cu_stream())
                .map_err(|e| err("copying to the device", e))?;
        }
        self.stream.synchronize().map_err(|e| err("synchronising", e))
    }

    fn download(&self, src: &CudaBuf, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        let p = src.at(offset, dst.len())?;
        // SAFETY: the range lies inside `src` (checked); we synchronise the
        // stream before returning, so `dst` is written before it is read.
        unsafe {
            result::memcpy_dtoh_async(dst, p, self.stream.cu_stream())
                .map_err(|e| err("copying to the host", e))?;
        }
        self.stream.synchronize().map_err(|e| err("synchronising", e))
    }

    fn copy(&self, src: (&CudaBuf, usize), dst: (&CudaBuf, usize), bytes: usize) -> Result<()> {
        self.bind()?;
        let (s, d) = (src.0.at(src.1, bytes)?, dst.0.at(dst.1, bytes)?);
        // SAFETY: both ranges lie inside live buffers (checked); ordered on
        // the compute stream.
        unsafe { result::memcpy_dtod_async(d, s, bytes, self.stream.cu_stream()) }
            .map_err(|e| err("copying on the device", e))
    }

    fn launch(&self, kernel: &str, grid: (u32, u32, u32), args: &[Arg<'_, CudaBuf>]) -> Result<()> {
        self.bind()?;
        let f = self.functions.get(kernel).ok_or_else(|| DeviceError(format!("no kernel named {kernel}")))?;
        let mut values: Vec<u64> = Vec::with_capacity(args.len());
        for a in args {
            values.push(match *a {
                Arg::Buf(b, off) => b.at(off, 0)?,
                Arg::I32(v) => u64::from(v as u32),
                Arg::I64(v) => v as u64,
                Arg::F32(v) => u64::from(v.to_bits()),
            });
        }
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        // SAFETY: `params` has one pointer per kernel parameter, in order,
        // each to a value at least as wide as the parameter (4-byte values
        // sit in the low half of a little-endian u64); the kernels' argument
        // lists are the ones in kernels/cuda and the models pass them in
        // that order; pointers are device addresses inside live buffers,
        // which outlive the launch because they are freed in stream order.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                (BLOCK, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| err(&format!("launching {kernel}"), e))
    }

    fn gemm(&self, g: Gemm<'_, CudaBuf>) -> Result<()> {
        self.bind()?;
        let a = g.a.0.at(g.a.1 * 2, g.m * g.k * 2)?;
        let b = g.b.0.at(g.b.1 * 2, g.n * g.k * 2)?;
        let (c_width, c_type) = if g.bf16_out {
            (2, blas_sys::cudaDataType::CUDA_R_16BF)
        } else {
            (4, blas_sys::cudaDataType::CUDA_R_32F)
        };
        let c = g.c.0.at(g.c.1 * c_width, g.m * g.n * c_width)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        // Row-major C (m × n) = A · Bᵀ is column-major Cᵀ (n × m) = B · Aᵀ:
        // B read transposed (its rows are k long), A as it is.
        // SAFETY: a, b and c are device ranges of the sizes cuBLAS reads and
        // writes for these dimensions (checked above); alpha and beta are
        // host scalars alive for the call; the handle's stream is the
        // compute stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                g.n as i32,
                g.m as i32,
                g.k as i32,
                &alpha as *const f32 as *const c_void,
                b as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                g.k as i32,
                a as *const c_void,
                blas_sys::cudaDataType::CUDA_R_16BF,
                g.k as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                c_type,
                g.n as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| err("cuBLAS GemmEx", e))
    }

    fn alloc_host(&self, bytes: usize) -> Result<PinnedHost> {
        self.bind()?;
        // SAFETY: a fresh page-locked allocation, zeroed below before any
        // read; freed by `PinnedHost::drop`.
        let ptr = unsafe { result::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| err("allocating pinned host memory", e))? as *mut u8;
        // SAFETY: `ptr` points at `bytes.max(1)` writable bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes.max(1)) };
        Ok(PinnedHost { ptr, bytes })
    }

    fn host_bytes<'h>(&self, host: &'h PinnedHost) -> &'h [u8] {
        // SAFETY: `ptr` owns `bytes` initialised bytes (zeroed at
        // allocation); callers read after `wait_copies`.
        unsafe { std::slice::from_raw_parts(host.ptr, host.bytes) }
    }

    fn offload(&self, src: (&CudaBuf, usize), dst: &mut PinnedHost, bytes: usize) -> Result<()> {
        self.bind()?;
        let s = src.0.at(src.1, bytes)?;
        if bytes > dst.bytes {
            return Err(DeviceError("pinned buffer too small".into()));
        }
        self.order(&self.stream, &self.copy)?;
        // SAFETY: `dst` is page-locked and holds `bytes`; it is borrowed
        // mutably here and read only after `wait_copies`; the source range is
        // inside a live buffer and the copy stream waits for the compute
        // that wrote it.
        unsafe {
            let host = std::slice::from_raw_parts_mut(dst.ptr, bytes);
            result::memcpy_dtoh_async(host, s, self.copy.cu_stream())
        }
        .map_err(|e| err("offloading to pinned memory", e))
    }

    fn restore(&self, src: &PinnedHost, dst: (&CudaBuf, usize), bytes: usize) -> Result<()> {
        self.bind()?;
        let d = dst.0.at(dst.1, bytes)?;
        if bytes > src.bytes {
            return Err(DeviceError("pinned buffer too small".into()));
        }
        // The copy must not overwrite what earlier compute still reads, and
        // later compute must see it: order both ways.
        self.order(&self.stream, &self.copy)?;
        // SAFETY: `src` is page-locked, holds `bytes` and stays alive (the
        // caller keeps it until `wait_copies`); the destination range is
        // inside a live buffer.
        unsafe {
            let host = std::slice::from_raw_parts(src.ptr, bytes);
            result::memcpy_htod_async(d, host, self.copy.cu_stream())
        }
        .map_err(|e| err("restoring from pinned memory", e))?;
        self.order(&self.copy, &self.stream)
    }

    fn wait_copies(&self) -> Result<()> {
        self.bind()?;
        self.copy.synchronize().map_err(|e| err("synchronising the copy stream", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.stream.synchronize().map_err(|e| err("synchronising", e))
    }
}
