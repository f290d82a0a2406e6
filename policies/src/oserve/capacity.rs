//! Per-configuration capacities (OServe's one-time profiling, Appendix D),
//! derived from a documented cost model for the emulated backend.
//!
//! A replica runs the model on `tp · pp` GPUs (tensor parallel degree `tp`,
//! pipeline stages `pp`). With `P` parameters of `bytes` each, `L` layers,
//! hidden width `h`, a GPU of `F` FLOP/s (effective), `B` bytes/s of HBM,
//! `Mem` bytes, a link of `Lk` bytes/s per GPU and `α` per collective:
//!
//! - prefill of `I` tokens (compute-bound, §D): `2·P·I / (tp·F)` plus
//!   TP's two all-reduces per layer, `L·2·(α + 2·(tp−1)/tp · I·h·2 / Lk)`
//!   when `tp > 1`, pipelined over the stages: the batch is cut into
//!   `m = pp` micro-batches of `I / m` tokens (GPipe), each stage holds
//!   `1 / pp` of the layers, so the batch takes `m + pp − 1` stage times of
//!   one micro-batch plus `pp − 1` activation hops `α + (I/m)·h·2 / Lk`:
//!   `(2·pp − 1) / pp²` of the unpipelined time (3/4 at PP2, 7/16 at PP4);
//! - one decode step of `b` sequences at context `c` (memory-bound): the
//!   weights `P·bytes / (tp·B)` (each stage reads its share, the stages in
//!   turn), the KV `b·c·kv / (tp·B)`, compute `2·P·b / (tp·F)` when larger
//!   than the reads, the same TP all-reduces for `b` rows and PP hops;
//! - concurrency: the KV room left after the weights,
//!   `0.9·Mem·tp·pp − P·bytes`, over `kv·(I + O)` per sequence, capped by
//!   `max_batch`; pipelining keeps `pp` micro-batches in flight, so a step
//!   of all `b` sequences takes the time of one micro-batch of `b / pp`
//!   through every stage;
//! - capacity `n` for type (I, O) in requests per second: a replica spends
//!   `prefill(I)` per request and `O` decode steps shared by `b` sequences,
//!   `n = 1 / (prefill(I) + O · step(b, I + O/2) / b)`.
//!
//! This is what OServe exploits: long contexts need KV room (more GPUs per
//! replica, TP or PP), short requests are served best by many small
//! replicas (data parallelism).

/// The model and the GPU of the cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Parameters, in billions.
    pub params_b: f64,
    pub layers: u32,
    pub hidden: u32,
    /// Attention heads: a TP degree must divide them (and the KV heads);
    /// 64 for Llama-2-70B (TP 1, 2, 4, 8), 72 for OPT-66B (also TP 3, 6).
    pub heads: u32,
    /// Bytes per parameter (2: bf16).
    pub bytes_per_param: f64,
    /// KV bytes per token (all layers, K and V).
    pub kv_bytes_per_token: f64,
    /// Effective dense FLOP/s of one GPU, in TFLOP/s.
    pub gpu_tflops: f64,
    /// HBM bytes/s of one GPU, in TB/s.
    pub gpu_tbs: f64,
    /// GPU memory, GB.
    pub gpu_gb: f64,
    /// GPU-to-GPU link bytes/s per GPU, GB/s.
    pub link_gbs: f64,
    /// Latency of one collective or pipeline hop, microseconds.
    pub hop_us: f64,
    /// Most sequences a replica runs at once.
    pub max_batch: u32,
}

impl CostModel {
    /// A 70B model of Llama-2-70B's shape (80 layers, hidden 8192, grouped
    /// KV of 8 heads × 128: 2·80·8·128·2 = 327,680 bytes of KV per token) on
    /// H200-class GPUs (141 GB, 4.8 TB/s, 400 effective TFLOP/s of the ~990
    /// dense bf16 peak, NVLink 450 GB/s each way), 256 sequences at most
    /// per replica: two GPUs hold the weights with ~114 GB of KV room, so
    /// short requests fill a 2-GPU replica's batch while long ones run out of
    /// KV room first, the trade-off OServe exploits.
    pub const LLAMA70B_H200: CostModel = CostModel {
        params_b: 70.0,
        layers: 80,
        hidden: 8192,
        heads: 64,
        bytes_per_param: 2.0,
        kv_bytes_per_token: 327_680.0,
        gpu_tflops: 400.0,
        gpu_tbs: 4.8,
        gpu_gb: 141.0,
        link_gbs: 450.0,
        hop_us: 10.0,
        max_batch: 256,
    };

    /// The same model on H100-80GB GPUs, the paper's testbed (80 GB,
    /// 3.35 TB/s, 400 effective TFLOP/s, NVLink 400 GB/s as §6 states): two
    /// GPUs hold the weights with only ~4 GB of KV room, so a 2-GPU replica
    /// serves short requests only and long contexts need 4 or more GPUs —
    /// the strong form of the trade-off.
    pub const LLAMA70B_H100: CostModel =
        CostModel { gpu_tbs: 3.35, gpu_gb: 80.0, link_gbs: 400.0, ..CostModel::LLAMA70B_H200 };

    /// OPT-66B (64 layers, hidden 9216, 72 heads, full multi-head KV:
    /// 2·64·9216·2 = 2,359,296 bytes per token, 7.2x Llama-2-70B's grouped
    /// KV) on H100-80GB: the model of the paper's Table 3 deployments, whose
    /// 72 heads allow TP3 and TP6. Two GPUs hold its 132 GB of weights with
    /// room for ~5,000 tokens of KV, three with ~36,000, four ~66,000.
    pub const OPT66B_H100: CostModel = CostModel {
        params_b: 66.0,
        layers: 64,
        hidden: 9216,
        heads: 72,
        kv_bytes_per_token: 2_359_296.0,
        ..CostModel::LLAMA70B_H100
    };

    /// OPT-66B on H200-141GB.
    pub const OPT66B_H200: CostModel =
        CostModel { gpu_tbs: 4.8, gpu_gb: 141.0, link_gbs: 450.0, ..CostModel::OPT66B_H100 };

    fn weight_bytes(&self) -> f64 {
        self.params_b * 1e9 * self.bytes_per_param
    }

    /// Whether the weights fit on `p` with some KV room.
    pub fn fits(&self, p: Parallel) -> bool {
        self.kv_room(p) > 0.0
    }

    fn kv_room(&self, p: Parallel) -> f64 {
        0.9 * self.gpu_gb * 1e9 * f64::from(p.gpus()) - self.weight_bytes()
    }

    fn tp_comm_s(&self, p: Parallel, rows: f64) -> f64 {
        if p.tp <= 1 {
            return 0.0;
        }
        let tp = f64::from(p.tp);
        let bytes = 2.0 * (tp - 1.0) / tp * rows * f64::from(self.hidden) * 2.0;
        f64::from(self.layers) * 2.0 * (self.hop_us * 1e-6 + bytes / (self.link_gbs * 1e9))
    }

    fn pp_comm_s(&self, p: Parallel, rows: f64) -> f64 {
        f64::from(p.pp - 1)
            * (self.hop_us * 1e-6 + rows * f64::from(self.hidden) * 2.0 / (self.link_gbs * 1e9))
    }

    /// Seconds to prefill a batch of `input` tokens on `p`, pipelined: `pp`
    /// micro-batches of `input / pp` tokens, each stage `1 / pp` of the
    /// layers, `2·pp − 1` stage times end to end plus the hops.
    pub fn prefill_s(&self, p: Parallel, input: f64) -> f64 {
        let (pp, micro) = (f64::from(p.pp), input / f64::from(p.pp));
        let flops = 2.0 * self.params_b * 1e9 * micro;
        let stage = (flops / (f64::from(p.tp) * self.gpu_tflops * 1e12) + self.tp_comm_s(p, micro)) / pp;
        (2.0 * pp - 1.0) * stage + self.pp_comm_s(p, micro)
    }

    /// Seconds of one decode step of `batch` sequences at `context` tokens.
    pub fn step_s(&self, p: Parallel, batch: f64, context: f64) -> f64 {
        let tp = f64::from(p.tp);
        let reads =
            (self.weight_bytes() + batch * context * self.kv_bytes_per_token) / (tp * self.gpu_tbs * 1e12);
        let compute = 2.0 * self.params_b * 1e9 * batch / (tp * self.gpu_tflops * 1e12);
        reads.max(compute) + self.tp_comm_s(p, batch) + self.pp_comm_s(p, batch)
    }

    /// Seconds for every one of `batch` sequences to advance one token on
    /// `p`: with `pp` stages, `pp` micro-batches of `batch / pp` are in
    /// flight, so that takes one micro-batch's trip through the stages
    /// (each sequence's context still `context`).
    pub fn token_step_s(&self, p: Parallel, batch: f64, context: f64) -> f64 {
        self.step_s(p, (batch / f64::from(p.pp)).max(1.0), context)
    }

    /// Sequences of (input, output) tokens `p` runs at once.
    pub fn concurrency(&self, p: Parallel, input: f64, output: f64) -> f64 {
        (self.kv_room(p) / (self.kv_bytes_per_token * (input + output)))
            .floor()
            .clamp(0.0, f64::from(self.max_batch))
    }

    /// Requests per second of (input, output) tokens that `p` sustains
    /// alone (`n_kj`); 0 when the model or one sequence does not fit.
    pub fn capacity(&self, p: Parallel, input: f64, output: f64) -> f64 {
        let b = self.concurrency(p, input, output);
        if b < 1.0 {
            return 0.0;
        }
        let step = self.token_step_s(p, b, input + output / 2.0);
        1.0 / (self.prefill_s(p, input) + output * step / b)
    }
}

/// The most GPUs one replica takes.
pub const MAX_REPLICA_GPUS: u32 = 16;

/// The largest TP degree (one node's GPUs).
pub const MAX_TP: u32 = 8;

impl CostModel {
    /// Every TP × PP split of `gpus` GPUs the model fits on: TP up to 8
    /// dividing the GPUs and the attention heads (TP3 and TP6 for OPT-66B's
    /// 72), the rest pipeline stages (at most one per layer).
    pub fn splits(&self, gpus: u32) -> Vec<Parallel> {
        (1..=MAX_TP)
            .filter(|&tp| gpus % tp == 0 && self.heads % tp == 0 && gpus / tp <= self.layers)
            .map(|tp| Parallel { tp, pp: gpus / tp })
            .filter(|&p| self.fits(p))
            .collect()
    }

    /// Every configuration of 1 to 16 GPUs the model fits on, any GPU
    /// count (three, five, six…): the replicas a deployment is made of.
    pub fn configurations(&self) -> Vec<Parallel> {
        (1..=MAX_REPLICA_GPUS).flat_map(|g| self.splits(g)).collect()
    }

    /// The most that any deployment of [`CostModel::configurations`] can
    /// sustain of any mix of `types` (input, output), as a multiple of what
    /// the homogeneous deployment of `base` sustains on the same GPUs (a
    /// multiple of `base`'s count): the largest, over the types, of the
    /// best configuration's requests per second per GPU over `base`'s.
    ///
    /// Why it bounds every mix: serving a type-`j` request on a replica of
    /// `g` GPUs costs `g / n_j` GPU-seconds (constraint C3 shares a
    /// replica's time between types), so at rate `R` in shares `s_j` a
    /// deployment of `G` GPUs needs `R · Σ s_j / ρ_j ≤ G`, where `ρ_j` is
    /// the per-GPU rate of the replica serving it; the best configuration
    /// per type gives the most, `G / Σ s_j / ρ*_j`, and the homogeneous
    /// deployment of `base` reaches `G / Σ s_j / ρ_base,j` exactly (each
    /// replica serves the mix). Their ratio is at most `max_j ρ*_j /
    /// ρ_base,j`. Infinite when `base` cannot serve some type at all.
    pub fn gain_bound(&self, base: Parallel, types: &[(f64, f64)]) -> f64 {
        let per_gpu = |p: Parallel, (i, o): (f64, f64)| self.capacity(p, i, o) / f64::from(p.gpus());
        let all = self.configurations();
        types
            .iter()
            .map(|&t| {
                let best = all.iter().map(|&p| per_gpu(p, t)).fold(0.0, f64::max);
                let own = per_gpu(base, t);
                if own > 0.0 {
                    best / own
                } else {
                    f64::INFINITY
                }
            })
            .fold(1.0, f64::max)
    }
}

/// A replica's parallel configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Parallel {
    pub tp: u32,
    pub pp: u32,
}

impl Parallel {
    pub fn gpus(self) -> u32 {
        self.tp * self.pp
    }
}

impl std::fmt::Display for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TP{}PP{}", self.tp, self.pp)
    }
}

impl CostModel {
    /// A latency profile of `p` (the emulated backend replays it, admission
    /// and batch formation read it), with the derivation in its comments:
    /// prefill at 128-8192 tokens, decode steps at batch 1-256 and zero
    /// context, and the context term (the KV reads per 1,000 tokens), both
    /// pipelined as [`CostModel::token_step_s`] (a step of `b` sequences
    /// reads the KV of one micro-batch of `b / pp`).
    pub fn profile_toml(&self, p: Parallel, model: &str, class: &str) -> String {
        let ms = |s: f64| (s * 1e3 * 1000.0).round() / 1000.0;
        let prefill: Vec<String> = [128.0, 512.0, 2048.0, 8192.0]
            .iter()
            .map(|&n| format!("[{n}, {}]", ms(self.prefill_s(p, n))))
            .collect();
        let batches = [1.0, 8.0, 32.0, 64.0, 128.0, 256.0];
        let decode: Vec<String> = batches
            .iter()
            .filter(|&&b| b <= f64::from(self.max_batch))
            .map(|&b| format!("[{b}, {}]", ms(self.token_step_s(p, b, 0.0))))
            .collect();
        let per_1k = self.kv_bytes_per_token * 1000.0 / (f64::from(p.gpus()) * self.gpu_tbs * 1e12) * 1e3;
        format!(
            "# Latency profile of {model} as {p} on {gpus} GPUs, derived from the cost model of\n\
             # policies/src/oserve/capacity.rs (not measured): {params} B parameters of {bytes} bytes, {layers} layers,\n\
             # hidden {hidden}, {kv} bytes of KV per token; per GPU {tf} TFLOP/s effective, {tb} TB/s, {gb} GB;\n\
             # links {link} GB/s and {hop} us per collective or hop.\n\
             #   prefill(n)    = (2 pp - 1) stage times of a micro-batch of n / pp tokens\n\
             #                   (stage: (2 P n/pp / (tp F) + TP all-reduces) / pp) + PP hops\n\
             #   decode step(b) = max(weights + KV reads / (tp B), 2 P b' / (tp F)) + TP all-reduces + PP hops,\n\
             #                    b' = b / pp: pp micro-batches in flight, one trip per token\n\
             #   context term  = KV bytes per 1,000 tokens / (tp pp B) = {per_1k:.4} ms\n\
             # KV room after the weights: {room:.1} GB.\n\
             model = \"{model}\"\nengine_class = \"{class}\"\n\
             source = \"derived: policies::oserve::capacity cost model, {p}\"\n\n\
             [prefill]\n# [prompt tokens, milliseconds]\npoints = [{pre}]\n\n\
             [decode]\n# [batch size, milliseconds per decode step] at zero context\nbatch_points = [{dec}]\n\
             # extra step time per 1,000 tokens of context summed over the batch\nms_per_1k_context = {per_1k:.4}\n",
            gpus = p.gpus(),
            params = self.params_b,
            bytes = self.bytes_per_param,
            layers = self.layers,
            hidden = self.hidden,
            kv = self.kv_bytes_per_token,
            tf = self.gpu_tflops,
            tb = self.gpu_tbs,
            gb = self.gpu_gb,
            link = self.link_gbs,
            hop = self.hop_us,
            room = self.kv_room(p) / 1e9,
            pre = prefill.join(", "),
            dec = decode.join(", "),
        )
    }
}
