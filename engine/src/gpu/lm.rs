//! The synthetic language model on a [`Device`]: the cpu backend's network
//! (`crate::backend::cpu::model`), with matrix products through the
//! device's GEMM (bf16 weights and activations, fp32 accumulation) and the
//! rest in the kernels of `kernels/cuda/lm.cu`. K/V live in a paged cache
//! on the device addressed by the engine allocator's page ids, like the
//! cpu backend's arena.

use std::sync::Arc;

use kernels::{bf16_bits, f32_bytes, f32s, i32_bytes, Arg, Device, DeviceError, Gemm, Result, BLOCK};

use crate::models::lm::{inv_freq, per_sequence, ModelConfig, SeqInput, Weights};

struct Layer<B> {
    wqkv: B,
    wo: B,
    w_gate_up: B,
    w_down: B,
    /// The begin-of-sequence token's K and V of this layer (hidden each).
    bos_kv: B,
}

/// The model's weights and K/V cache on a device.
pub struct GpuLm<D: Device> {
    dev: Arc<D>,
    pub cfg: ModelConfig,
    embed: D::Buf,
    layers: Vec<Layer<D::Buf>>,
    lm_head: D::Buf,
    ones: D::Buf,
    inv_freq: D::Buf,
    k_cache: D::Buf,
    v_cache: D::Buf,
    pages: usize,
    pub(crate) page_tokens: usize,
    bos_logits: Vec<f32>,
    /// Work buffers kept between steps (their row capacity), and the
    /// scores buffer (its bytes): decode would otherwise allocate and zero
    /// ten buffers a step.
    scratch: std::sync::Mutex<Option<(usize, Act<D::Buf>)>>,
    scores: std::sync::Mutex<Option<(usize, D::Buf)>>,
}

fn bf16_upload<D: Device>(dev: &D, w: &[f32]) -> Result<D::Buf> {
    let b = dev.alloc(w.len() * 2)?;
    let bytes: Vec<u8> = w.iter().flat_map(|x| bf16_bits(*x).to_le_bytes()).collect();
    dev.upload(&b, 0, &bytes)?;
    Ok(b)
}

fn f32_upload<D: Device>(dev: &D, v: &[f32]) -> Result<D::Buf> {
    let b = dev.alloc(v.len().max(1) * 4)?;
    dev.upload(&b, 0, &f32_bytes(v))?;
    Ok(b)
}

fn i32_upload<D: Device>(dev: &D, v: &[i32]) -> Result<D::Buf> {
    let b = dev.alloc(v.len().max(1) * 4)?;
    dev.upload(&b, 0, &i32_bytes(v))?;
    Ok(b)
}

/// Work buffers of one forward pass of `rows` rows.
struct Act<B> {
    x: B,
    xn: B,
    /// bf16 copy of the widest activation a GEMM reads.
    xb: B,
    qkv: B,
    att: B,
    tmp: B,
    gu: B,
    act: B,
}

impl<D: Device> GpuLm<D> {
    /// Uploads the weights of `cfg` and allocates a cache of `pages` pages
    /// of `page_tokens` tokens; runs the begin-of-sequence token once.
    pub fn new(dev: Arc<D>, cfg: ModelConfig, pages: u32, page_tokens: u32) -> Result<Self> {
        if cfg.head_dim() > 256 {
            return Err(DeviceError(format!("head width {} is over lm_attention's 256", cfg.head_dim())));
        }
        let w = Weights::generate(&cfg);
        let h = cfg.hidden;
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    wqkv: bf16_upload(&*dev, &l.wqkv)?,
                    wo: bf16_upload(&*dev, &l.wo)?,
                    w_gate_up: bf16_upload(&*dev, &l.w_gate_up)?,
                    w_down: bf16_upload(&*dev, &l.w_down)?,
                    bos_kv: dev.alloc(2 * h * 4)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (pages, page_tokens) = (pages.max(1) as usize, page_tokens.max(1) as usize);
        let cache = cfg.layers * pages * page_tokens * h * 4;
        let mut lm = Self {
            embed: f32_upload(&*dev, &w.embed)?,
            lm_head: bf16_upload(&*dev, &w.lm_head)?,
            ones: f32_upload(&*dev, &vec![1.0; h])?,
            inv_freq: f32_upload(&*dev, &inv_freq(&cfg))?,
            k_cache: dev.alloc(cache)?,
            v_cache: dev.alloc(cache)?,
            layers,
            pages,
            page_tokens,
            bos_logits: Vec::new(),
            scratch: std::sync::Mutex::new(None),
            scores: std::sync::Mutex::new(None),
            cfg,
            dev,
        };
        lm.init_bos(&w.embed[..h])?;
        Ok(lm)
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    fn act(&self, rows: usize) -> Result<Act<D::Buf>> {
        let (h, f) = (self.cfg.hidden, self.cfg.ffn);
        let dev = &*self.dev;
        let widest = (h.max(f).max(3 * h)) * rows;
        Ok(Act {
            x: dev.alloc(rows * h * 4)?,
            xn: dev.alloc(rows * h * 4)?,
            xb: dev.alloc(widest * 2)?,
            qkv: dev.alloc(rows * 3 * h * 4)?,
            att: dev.alloc(rows * h * 4)?,
            tmp: dev.alloc(rows * h * 4)?,
            gu: dev.alloc(rows * 2 * f * 4)?,
            act: dev.alloc(rows * f * 4)?,
        })
    }

    /// `out = bf16(x) · wᵀ` for `rows` rows of `k` (w: n × k): up to
    /// [`kernels::GEMV_ROWS`] rows (decode) in `lm_gemv`, which reads the
    /// f32 rows as they are; more through the bf16 scratch `xb` and cuBLAS.
    fn linear(
        &self,
        x: &D::Buf,
        xb: &D::Buf,
        w: &D::Buf,
        out: &D::Buf,
        (rows, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if rows <= kernels::GEMV_ROWS && k % 8 == 0 {
            return self.gemv(x, w, out, (rows, n, k), false);
        }
        let count = rows * k;
        self.dev.launch(
            "to_bf16",
            ((count as u32).div_ceil(BLOCK).max(1), 1, 1),
            &[Arg::Buf(x, 0), Arg::Buf(xb, 0), Arg::I32(count as i32)],
        )?;
        self.dev.gemm(Gemm { a: (xb, 0), b: (w, 0), c: (out, 0), m: rows, n, k, bf16_out: false })
    }

    /// Decode's product: streams the weights once, straight from the f32
    /// rows; with `accumulate`, adds into `out` (the residual).
    fn gemv(
        &self,
        x: &D::Buf,
        w: &D::Buf,
        out: &D::Buf,
        (rows, n, k): (usize, usize, usize),
        accumulate: bool,
    ) -> Result<()> {
        self.dev.launch(
            "lm_gemv",
            ((n as u32).div_ceil(BLOCK / 32), 1, 1),
            &[
                Arg::Buf(x, 0),
                Arg::Buf(w, 0),
                Arg::Buf(out, 0),
                Arg::I32(rows as i32),
                Arg::I32(n as i32),
                Arg::I32(k as i32),
                Arg::I32(i32::from(accumulate)),
            ],
        )
    }

    /// `residual += x · wᵀ` (through `tmp` when the product is cuBLAS's).
    fn linear_add(
        &self,
        x: &D::Buf,
        a: &Act<D::Buf>,
        w: &D::Buf,
        residual: &D::Buf,
        (rows, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if rows <= kernels::GEMV_ROWS && k % 8 == 0 {
            return self.gemv(x, w, residual, (rows, n, k), true);
        }
        self.linear(x, &a.xb, w, &a.tmp, (rows, n, k))?;
        self.add(residual, &a.tmp, rows * n)
    }

    fn add(&self, x: &D::Buf, y: &D::Buf, n: usize) -> Result<()> {
        self.dev.launch(
            "add_into",
            ((n as u32).div_ceil(BLOCK).max(1), 1, 1),
            &[Arg::Buf(x, 0), Arg::Buf(y, 0), Arg::I32(n as i32)],
        )
    }

    fn rmsnorm(&self, x: &D::Buf, out: &D::Buf, rows: usize) -> Result<()> {
        self.dev.launch(
            "lm_rmsnorm",
            (rows as u32, 1, 1),
            &[Arg::Buf(x, 0), Arg::Buf(&self.ones, 0), Arg::Buf(out, 0), Arg::I32(self.cfg.hidden as i32)],
        )
    }

    /// The residual SwiGLU block on every row of `a.x`.
    fn mlp(&self, l: &Layer<D::Buf>, a: &Act<D::Buf>, rows: usize) -> Result<()> {
        let (h, f) = (self.cfg.hidden, self.cfg.ffn);
        self.rmsnorm(&a.x, &a.xn, rows)?;
        self.linear(&a.xn, &a.xb, &l.w_gate_up, &a.gu, (rows, 2 * f, h))?;
        self.dev.launch(
            "lm_swiglu",
            (rows as u32, 1, 1),
            &[Arg::Buf(&a.gu, 0), Arg::Buf(&a.act, 0), Arg::I32(f as i32)],
        )?;
        self.linear_add(&a.act, a, &l.w_down, &a.x, (rows, h, f))
    }

    /// Final norm and head over `rows` rows of `x`: logits on the host.
    fn head(&self, a: &Act<D::Buf>, x: &D::Buf, rows: usize) -> Result<Vec<f32>> {
        let (h, v) = (self.cfg.hidden, self.cfg.vocab);
        self.rmsnorm(x, &a.xn, rows)?;
        let logits = self.dev.alloc(rows * v * 4)?;
        self.linear(&a.xn, &a.xb, &self.lm_head, &logits, (rows, v, h))?;
        let mut bytes = vec![0u8; rows * v * 4];
        self.dev.download(&logits, 0, &mut bytes)?;
        Ok(f32s(&bytes))
    }

    /// The begin-of-sequence token (id 0, position 0) through the network;
    /// it attends only to itself, so its attention output is its V.
    fn init_bos(&mut self, first_row: &[f32]) -> Result<()> {
        let h = self.cfg.hidden;
        let a = self.act(1)?;
        self.dev.upload(&a.x, 0, &f32_bytes(first_row))?;
        for l in &self.layers {
            self.rmsnorm(&a.x, &a.xn, 1)?;
            self.linear(&a.xn, &a.xb, &l.wqkv, &a.qkv, (1, 3 * h, h))?;
            self.dev.copy((&a.qkv, h * 4), (&l.bos_kv, 0), 2 * h * 4)?;
            self.dev.copy((&a.qkv, 2 * h * 4), (&a.att, 0), h * 4)?;
            self.linear(&a.att, &a.xb, &l.wo, &a.tmp, (1, h, h))?;
            self.add(&a.x, &a.tmp, h)?;
            self.mlp(l, &a, 1)?;
        }
        self.bos_logits = self.head(&a, &a.x, 1)?;
        Ok(())
    }

    /// Runs every sequence's tokens through the network as one batch,
    /// writing their K/V into the cache, and returns each sequence's logits
    /// for the token after its last one (the cpu backend's
    /// `Model::forward`).
    pub fn forward(&self, seqs: &[SeqInput<'_>]) -> Result<Vec<Vec<f32>>> {
        let (h, heads) = (self.cfg.hidden, self.cfg.heads);
        let dev = &*self.dev;
        let Some(t) = self.tables(seqs)? else {
            return Ok(per_sequence(seqs, &[], self.cfg.vocab, &self.bos_logits));
        };
        let (cap, a) = match self.scratch.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some((cap, a)) if cap >= t.rows => (cap, a),
            _ => (t.rows.next_power_of_two(), self.act(t.rows.next_power_of_two())?),
        };
        let want = t.rows * heads * t.stride * 4;
        let (scores_cap, scores) = match self.scores.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some((bytes, b)) if bytes >= want => (bytes, b),
            _ => (want.next_power_of_two(), dev.alloc(want.next_power_of_two())?),
        };
        dev.launch(
            "lm_embed",
            (t.rows as u32, 1, 1),
            &[
                Arg::Buf(&self.embed, 0),
                Arg::Buf(&t.buf, t.tokens),
                Arg::Buf(&a.x, 0),
                Arg::I32(h as i32),
                Arg::I32(self.cfg.vocab as i32),
            ],
        )?;
        for (li, l) in self.layers.iter().enumerate() {
            self.rmsnorm(&a.x, &a.xn, t.rows)?;
            self.linear(&a.xn, &a.xb, &l.wqkv, &a.qkv, (t.rows, 3 * h, h))?;
            self.attention(li, l, &t, &a, &scores)?;
            self.linear_add(&a.att, &a, &l.wo, &a.x, (t.rows, h, h))?;
            self.mlp(l, &a, t.rows)?;
        }
        let lasts = dev.alloc(t.lasts.max(1) * h * 4)?;
        dev.launch(
            "gather_rows",
            (t.lasts as u32, 1, 1),
            &[Arg::Buf(&a.x, 0), Arg::Buf(&t.buf, t.last), Arg::Buf(&lasts, 0), Arg::I32(h as i32)],
        )?;
        let logits = self.head(&a, &lasts, t.lasts)?;
        *self.scratch.lock().unwrap_or_else(|p| p.into_inner()) = Some((cap, a));
        *self.scores.lock().unwrap_or_else(|p| p.into_inner()) = Some((scores_cap, scores));
        Ok(per_sequence(seqs, &logits, self.cfg.vocab, &self.bos_logits))
    }

    /// The step's index tables, uploaded in one copy: each row's token,
    /// position and cache slot, its sequence's page-table offset, the page
    /// tables, and each sequence's last row. `None` for a step without rows.
    fn tables(&self, seqs: &[SeqInput<'_>]) -> Result<Option<Tables<D::Buf>>> {
        let (mut tokens, mut pos, mut slot, mut table_off, mut table, mut last) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for inp in seqs {
            let off = table.len() as i32;
            table.extend(inp.pages.iter().map(|&p| p as i32));
            for (i, &t) in inp.tokens.iter().enumerate() {
                let p = inp.start + i;
                let page = *inp.pages.get(p / self.page_tokens).ok_or_else(|| {
                    DeviceError(format!("position {p} has no page (the caller checks capacity)"))
                })? as usize;
                if page >= self.pages {
                    return Err(DeviceError(format!("page {page} is outside the cache")));
                }
                tokens.push(t as i32);
                pos.push(p as i32);
                slot.push((page * self.page_tokens + p % self.page_tokens) as i32);
                table_off.push(off);
            }
            if !inp.tokens.is_empty() {
                last.push(tokens.len() as i32 - 1);
            }
        }
        if tokens.is_empty() {
            return Ok(None);
        }
        let mut all = Vec::new();
        let mut at = [0usize; 6];
        for (o, v) in at.iter_mut().zip([&tokens, &pos, &slot, &table_off, &table, &last]) {
            *o = all.len() * 4;
            all.extend_from_slice(v);
        }
        Ok(Some(Tables {
            buf: i32_upload(&*self.dev, &all)?,
            tokens: at[0],
            pos: at[1],
            slot: at[2],
            table_off: at[3],
            table: at[4],
            last: at[5],
            rows: tokens.len(),
            lasts: last.len(),
            stride: pos.iter().map(|&p| p as usize + 2).max().unwrap_or(2),
        }))
    }

    /// Layer `li`'s attention: rotate Q and K and store every row's K/V,
    /// then every row and head attends over the sink and its pages.
    fn attention(
        &self,
        li: usize,
        l: &Layer<D::Buf>,
        t: &Tables<D::Buf>,
        a: &Act<D::Buf>,
        scores: &D::Buf,
    ) -> Result<()> {
        let (h, hd) = (self.cfg.hidden as i32, self.cfg.head_dim() as i32);
        let layer_slots = (li * self.pages * self.page_tokens) as i64;
        self.dev.launch(
            "lm_rope_store",
            (t.rows as u32, 1, 1),
            &[
                Arg::Buf(&a.qkv, 0),
                Arg::Buf(&t.buf, t.pos),
                Arg::Buf(&t.buf, t.slot),
                Arg::Buf(&self.inv_freq, 0),
                Arg::Buf(&self.k_cache, 0),
                Arg::Buf(&self.v_cache, 0),
                Arg::I32(h),
                Arg::I32(hd),
                Arg::I64(layer_slots),
            ],
        )?;
        self.dev.launch(
            "lm_attention",
            (t.rows as u32, self.cfg.heads as u32, 1),
            &[
                Arg::Buf(&a.qkv, 0),
                Arg::Buf(&self.k_cache, 0),
                Arg::Buf(&self.v_cache, 0),
                Arg::Buf(&l.bos_kv, 0),
                Arg::Buf(&l.bos_kv, self.cfg.hidden * 4),
                Arg::Buf(&t.buf, t.pos),
                Arg::Buf(&t.buf, t.table),
                Arg::Buf(&t.buf, t.table_off),
                Arg::Buf(scores, 0),
                Arg::Buf(&a.att, 0),
                Arg::I32(h),
                Arg::I32(hd),
                Arg::I32(self.page_tokens as i32),
                Arg::I64(layer_slots),
                Arg::I32(t.stride as i32),
            ],
        )
    }
}

/// A step's index tables in one device buffer (byte offsets into `buf`).
struct Tables<B> {
    buf: B,
    tokens: usize,
    pos: usize,
    slot: usize,
    table_off: usize,
    table: usize,
    last: usize,
    /// Rows in the step, sequences with a last row, and the widest context
    /// (+ the sink) an attention row reads.
    rows: usize,
    lasts: usize,
    stride: usize,
}
