//! A host "GPU": the CUDA kernels of `kernels/cuda`, compiled as C++ by
//! this crate's build script, behind [`kernels::Device`].
//!
//! Device memory is host memory; a launch runs its blocks one after
//! another with [`kernels::BLOCK`] real threads each (so `__syncthreads`
//! and shared memory behave as on a GPU); the GEMM is a plain loop over
//! bf16 inputs with fp32 accumulation; offload and restore are immediate
//! copies. It is slow and exists for tests: the engine's GPU models run on
//! it and are checked against the cpu backend where no GPU is present.

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::Mutex;

use kernels::{bf16_to_f32, Arg, Device, DeviceError, Gemm, Result};

extern "C" {
    fn emu_launch(name: *const c_char, gx: c_uint, gy: c_uint, gz: c_uint, params: *mut *mut c_void)
        -> c_int;
}

/// A buffer of emulated device memory: 8-byte aligned, fixed address,
/// followed by guard words that a kernel writing past its end overwrites
/// (checked on every download and when the buffer is dropped).
pub struct EmuBuf {
    words: Box<[u64]>,
    bytes: usize,
}

/// Guard words after each buffer, and their pattern.
const GUARD_WORDS: usize = 64;
const GUARD: u64 = 0xDEAD_BEEF_CAFE_F00D;

/// The emulated device. Calls are serialised by one lock, as work on one
/// stream would be.
#[derive(Default)]
pub struct Emu {
    lock: Mutex<()>,
}

impl Emu {
    pub fn new() -> Self {
        Self::default()
    }
}

fn range(buf: &EmuBuf, offset: usize, len: usize) -> Result<std::ops::Range<usize>> {
    let end = offset.checked_add(len).filter(|&e| e <= buf.bytes);
    end.map(|e| offset..e).ok_or_else(|| {
        DeviceError(format!("{len} bytes at offset {offset} are outside a buffer of {} bytes", buf.bytes))
    })
}

impl EmuBuf {
    fn ptr(&self) -> *mut u8 {
        self.words.as_ptr() as *mut u8
    }

    /// Panics when a kernel wrote into the guard after the buffer (or into
    /// its padding to 8 bytes).
    fn check_guard(&self) {
        let data_words = self.bytes.div_ceil(8);
        let pad_ok = self.bytes % 8 == 0 || {
            let last = self.words[data_words - 1].to_le_bytes();
            last[self.bytes % 8..].iter().all(|&b| b == 0)
        };
        let guard_ok = self.words[data_words..].iter().all(|&w| w == GUARD);
        assert!(pad_ok && guard_ok, "a kernel wrote past the end of a {}-byte device buffer", self.bytes);
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` owns `bytes` (≤ 8 · words.len()) initialised bytes;
        // every access goes through `Emu`, which holds its lock.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.bytes) }
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as `bytes`; device memory is mutable through shared
        // handles, like a device pointer, and `Emu`'s lock serialises writers.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.bytes) }
    }
}

impl Drop for EmuBuf {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.check_guard();
        }
    }
}

// SAFETY: the buffer is plain memory; all reads and writes happen under
// `Emu`'s lock.
unsafe impl Send for EmuBuf {}
// SAFETY: as above.
unsafe impl Sync for EmuBuf {}

impl Device for Emu {
    type Buf = EmuBuf;
    type Host = Vec<u8>;

    fn name(&self) -> String {
        "host emulator".into()
    }

    fn alloc(&self, bytes: usize) -> Result<EmuBuf> {
        let mut words = vec![0u64; bytes.div_ceil(8) + GUARD_WORDS];
        words[bytes.div_ceil(8)..].fill(GUARD);
        Ok(EmuBuf { words: words.into_boxed_slice(), bytes })
    }

    fn upload(&self, dst: &EmuBuf, offset: usize, src: &[u8]) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let r = range(dst, offset, src.len())?;
        dst.bytes_mut()[r].copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: &EmuBuf, offset: usize, dst: &mut [u8]) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        src.check_guard();
        let r = range(src, offset, dst.len())?;
        dst.copy_from_slice(&src.bytes()[r]);
        Ok(())
    }

    fn copy(&self, src: (&EmuBuf, usize), dst: (&EmuBuf, usize), bytes: usize) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let (rs, rd) = (range(src.0, src.1, bytes)?, range(dst.0, dst.1, bytes)?);
        let tmp = src.0.bytes()[rs].to_vec();
        dst.0.bytes_mut()[rd].copy_from_slice(&tmp);
        Ok(())
    }

    fn launch(&self, kernel: &str, grid: (u32, u32, u32), args: &[Arg<'_, EmuBuf>]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        // The argument values live here; `params` points at each.
        let mut values: Vec<u64> = Vec::with_capacity(args.len());
        for a in args {
            values.push(match *a {
                Arg::Buf(b, off) => {
                    range(b, off, 0)?;
                    b.ptr() as u64 + off as u64
                }
                Arg::I32(v) => u64::from(v as u32),
                Arg::I64(v) => v as u64,
                Arg::F32(v) => u64::from(v.to_bits()),
            });
        }
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v as *mut u64 as *mut c_void).collect();
        let name = CString::new(kernel).map_err(|e| DeviceError(e.to_string()))?;
        // SAFETY: `params` holds one pointer per argument, each to a value
        // of at least the argument's size (little-endian, so a 4-byte
        // argument reads the low half of its u64); buffers outlive the call,
        // which returns only after every emulated thread has finished.
        let rc = unsafe { emu_launch(name.as_ptr(), grid.0, grid.1, grid.2, params.as_mut_ptr()) };
        if rc != 0 {
            return Err(DeviceError(format!("no kernel named {kernel}")));
        }
        Ok(())
    }

    fn gemm(&self, g: Gemm<'_, EmuBuf>) -> Result<()> {
        let _l = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let (a, b) = (range(g.a.0, g.a.1 * 2, g.m * g.k * 2)?, range(g.b.0, g.b.1 * 2, g.n * g.k * 2)?);
        let width = if g.bf16_out { 2 } else { 4 };
        let c = range(g.c.0, g.c.1 * width, g.m * g.n * width)?;
        let bf = |bytes: &[u8]| -> Vec<f32> {
            bytes.chunks_exact(2).map(|p| bf16_to_f32(u16::from_le_bytes([p[0], p[1]]))).collect()
        };
        let (av, bv) = (bf(&g.a.0.bytes()[a]), bf(&g.b.0.bytes()[b]));
        let out = &mut g.c.0.bytes_mut()[c];
        for i in 0..g.m {
            for j in 0..g.n {
                let s: f32 = (0..g.k).map(|t| av[i * g.k + t] * bv[j * g.k + t]).sum();
                let at = (i * g.n + j) * width;
                if g.bf16_out {
                    out[at..at + 2].copy_from_slice(&kernels::bf16_bits(s).to_le_bytes());
                } else {
                    out[at..at + 4].copy_from_slice(&s.to_le_bytes());
                }
            }
        }
        Ok(())
    }

    fn alloc_host(&self, bytes: usize) -> Result<Vec<u8>> {
        Ok(vec![0; bytes])
    }

    fn host_bytes<'h>(&self, host: &'h Vec<u8>) -> &'h [u8] {
        host
    }

    fn offload(&self, src: (&EmuBuf, usize), dst: &mut Vec<u8>, bytes: usize) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let r = range(src.0, src.1, bytes)?;
        dst.get_mut(..bytes)
            .ok_or_else(|| DeviceError("host buffer too small".into()))?
            .copy_from_slice(&src.0.bytes()[r]);
        Ok(())
    }

    fn restore(&self, src: &Vec<u8>, dst: (&EmuBuf, usize), bytes: usize) -> Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let r = range(dst.0, dst.1, bytes)?;
        let from = src.get(..bytes).ok_or_else(|| DeviceError("host buffer too small".into()))?;
        dst.0.bytes_mut()[r].copy_from_slice(from);
        Ok(())
    }

    fn wait_copies(&self) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels::{f32_bytes, f32s, i32_bytes, BLOCK};

    #[test]
    fn a_launch_runs_every_thread_of_every_block_and_reductions_meet() {
        let dev = Emu::new();
        let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
        let (bx, by) = (dev.alloc(4000).unwrap(), dev.alloc(4000).unwrap());
        dev.upload(&bx, 0, &f32_bytes(&x)).unwrap();
        dev.upload(&by, 0, &f32_bytes(&vec![1.0; 1000])).unwrap();
        let blocks = 1000u32.div_ceil(BLOCK);
        dev.launch("add_into", (blocks, 1, 1), &[Arg::Buf(&bx, 0), Arg::Buf(&by, 0), Arg::I32(1000)])
            .unwrap();
        let mut back = vec![0u8; 4000];
        dev.download(&bx, 0, &mut back).unwrap();
        assert_eq!(f32s(&back), x.iter().map(|v| v + 1.0).collect::<Vec<_>>());

        // RMSNorm uses a shared-memory block reduction across 128 threads.
        let rows: Vec<f32> = (0..2 * 300).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let (inp, gain, out) = (dev.alloc(2400).unwrap(), dev.alloc(1200).unwrap(), dev.alloc(2400).unwrap());
        dev.upload(&inp, 0, &f32_bytes(&rows)).unwrap();
        dev.upload(&gain, 0, &f32_bytes(&vec![2.0; 300])).unwrap();
        dev.launch(
            "lm_rmsnorm",
            (2, 1, 1),
            &[Arg::Buf(&inp, 0), Arg::Buf(&gain, 0), Arg::Buf(&out, 0), Arg::I32(300)],
        )
        .unwrap();
        let mut back = vec![0u8; 2400];
        dev.download(&out, 0, &mut back).unwrap();
        let got = f32s(&back);
        for r in 0..2 {
            let row = &rows[r * 300..(r + 1) * 300];
            let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / 300.0 + 1e-5).sqrt();
            for i in 0..300 {
                assert!((got[r * 300 + i] - row[i] * inv * 2.0).abs() < 1e-4);
            }
        }
        assert!(dev.launch("no_such_kernel", (1, 1, 1), &[]).is_err());
        // A launch told the buffer is longer than it is writes past its end.
        let short = dev.alloc(10 * 4).unwrap();
        dev.launch("add_into", (1, 1, 1), &[Arg::Buf(&short, 0), Arg::Buf(&by, 0), Arg::I32(12)]).unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut back = vec![0u8; 40];
            let _ = dev.download(&short, 0, &mut back);
        }));
        assert!(caught.is_err(), "an out-of-bounds write goes unnoticed");
        std::mem::forget(short);
        assert!(dev.upload(&bx, 3998, &i32_bytes(&[1])).is_err(), "out of bounds is an error, not a write");
    }
}
