// The synthetic language model's kernels beyond matrix products (those go
// through cuBLAS, bf16 inputs, fp32 accumulation). Row-major throughout; a
// "row" is one token of one sequence in the step's batch.

// x[r] = table[tokens[r]] (ids past the vocabulary clamp to its last).
extern "C" __global__ void lm_embed(const float* table, const unsigned int* tokens, float* x, int hidden, int vocab) {
    int r = blockIdx.x;
    unsigned int t = tokens[r];
    if (t >= (unsigned int)vocab) t = vocab - 1;
    for (int i = threadIdx.x; i < hidden; i += BLOCK) x[(size_t)r * hidden + i] = table[(size_t)t * hidden + i];
}

// RMSNorm with a gain, one block per row.
extern "C" __global__ void lm_rmsnorm(const float* x, const float* gain, float* out, int hidden) {
    __shared__ float red[BLOCK];
    const float* xr = x + (size_t)blockIdx.x * hidden;
    float s = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += BLOCK) s += xr[i] * xr[i];
    s = block_sum(s, red);
    float inv = 1.0f / sqrtf(s / (float)hidden + 1e-5f);
    for (int i = threadIdx.x; i < hidden; i += BLOCK) out[(size_t)blockIdx.x * hidden + i] = xr[i] * inv * gain[i];
}

// Rotary positions on Q and K of every head (a row at position p rotates by
// p + 1: the sink holds 0), then the row's K and V go into the paged cache
// at slot `layer_slots + slot[r]` (slot = page * page_tokens + p % page_tokens).
extern "C" __global__ void lm_rope_store(float* qkv, const int* pos, const int* slot, const float* inv_freq,
                                         float* kcache, float* vcache, int hidden, int head_dim, long long layer_slots) {
    int r = blockIdx.x;
    float* row = qkv + (size_t)r * 3 * hidden;
    int half = head_dim / 2;
    float p = (float)(pos[r] + 1);
    for (int i = threadIdx.x; i < hidden / 2; i += BLOCK) {
        int head = i / half, j = i % half;
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        float* q = row + head * head_dim + 2 * j;
        float a = q[0], b = q[1];
        q[0] = a * c - b * s;
        q[1] = a * s + b * c;
        float* k = row + hidden + head * head_dim + 2 * j;
        a = k[0];
        b = k[1];
        k[0] = a * c - b * s;
        k[1] = a * s + b * c;
    }
    __syncthreads();
    size_t at = (size_t)(layer_slots + slot[r]) * hidden;
    for (int i = threadIdx.x; i < hidden; i += BLOCK) {
        kcache[at + i] = row[hidden + i];
        vcache[at + i] = row[2 * hidden + i];
    }
}

// Widest head lm_attention takes (GpuLm::new checks).
#define LM_MAX_HEAD_DIM 256

// Attention of one row and one head (grid: rows x heads) over the sink and
// positions 0..=pos[r] of the row's sequence, read through its page table
// (`pages + table_off[r]`). Scores go to `scores` (rows x heads x stride),
// then softmax, then the weighted sum of V.
//
// Decode reads the whole context once per step, so the reads are what
// costs: each warp takes every (BLOCK/32)-th position and its 32 lanes
// read that position's K (then V) row together, coalesced, four positions
// in flight per warp; the warps' partial sums of V meet in shared memory.
extern "C" __global__ void lm_attention(const float* qkv, const float* kcache, const float* vcache,
                                        const float* bos_k, const float* bos_v, const int* pos,
                                        const int* pages, const int* table_off, float* scores, float* out,
                                        int hidden, int head_dim, int page_tokens, long long layer_slots, int stride) {
    __shared__ float red[BLOCK];
    __shared__ float part[BLOCK / 32][LM_MAX_HEAD_DIM];
    const int r = blockIdx.x, head = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warps = BLOCK / 32;
    const int ctx = pos[r] + 2;
    const float* q = qkv + (size_t)r * 3 * hidden + head * head_dim;
    const int* table = pages + table_off[r];
    float* sc = scores + ((size_t)r * gridDim.y + head) * stride;
    const float scale = 1.0f / sqrtf((float)head_dim);
    // Position j's row of this head in `cache` (j = 0: the sink's).
    auto row = [&](const float* cache, const float* bos, int j) -> const float* {
        if (j == 0) return bos + head * head_dim;
        const int p = j - 1;
        const long long s = layer_slots + (long long)table[p / page_tokens] * page_tokens + p % page_tokens;
        return cache + (size_t)s * hidden + head * head_dim;
    };
    float mx = -INFINITY;
    for (int j0 = warp; j0 < ctx; j0 += 4 * warps) {
        float d[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u * warps;
            float acc = 0.0f;
            if (j < ctx) {
                const float* k = row(kcache, bos_k, j);
                for (int i = lane; i < head_dim; i += 32) acc += q[i] * k[i];
            }
            d[u] = acc;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u * warps;
            const float dot = warp_sum(d[u]) * scale;  // every lane takes part
            if (j < ctx) {
                if (lane == 0) sc[j] = dot;
                mx = fmaxf(mx, dot);
            }
        }
    }
    mx = block_max(mx, red);  // its barriers also publish sc[]
    float sum = 0.0f;
    for (int j = threadIdx.x; j < ctx; j += BLOCK) {
        const float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    float acc[LM_MAX_HEAD_DIM / 32];
#pragma unroll
    for (int u = 0; u < LM_MAX_HEAD_DIM / 32; u++) acc[u] = 0.0f;
#pragma unroll 4
    for (int j = warp; j < ctx; j += warps) {
        const float p = sc[j];
        const float* v = row(vcache, bos_v, j);
#pragma unroll
        for (int u = 0; u < LM_MAX_HEAD_DIM / 32; u++) {
            const int i = lane + 32 * u;
            if (i < head_dim) acc[u] += p * v[i];
        }
    }
#pragma unroll
    for (int u = 0; u < LM_MAX_HEAD_DIM / 32; u++) {
        const int i = lane + 32 * u;
        if (i < head_dim) part[warp][i] = acc[u];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += BLOCK) {
        float o = 0.0f;
        for (int w = 0; w < warps; w++) o += part[w][i];
        out[(size_t)r * hidden + head * head_dim + i] = o / sum;
    }
}

// SiLU(gate) * up per row of [gate | up] (2 * ffn wide).
extern "C" __global__ void lm_swiglu(const float* gu, float* act, int ffn) {
    int r = blockIdx.x;
    for (int i = threadIdx.x; i < ffn; i += BLOCK) {
        float g = gu[(size_t)r * 2 * ffn + i], u = gu[(size_t)r * 2 * ffn + ffn + i];
        act[(size_t)r * ffn + i] = g / (1.0f + expf(-g)) * u;
    }
}

// y = x · wᵀ for a few rows (decode): x `rows` × k f32 (rows ≤ GEMV_ROWS),
// w n × k bf16 row-major, y rows × n f32. Bandwidth-bound: one warp per
// output column streams the column's weights once with 16-byte loads and
// applies them to every row; k is a multiple of 8. The rows are rounded to
// bf16 on the fly, so the product is the cuBLAS path's (bf16 operands, f32
// accumulation) with no conversion pass.
//
// With `accumulate`, y += x · wᵀ (a residual add fused into the product).
extern "C" __global__ void lm_gemv(const float* x, const unsigned short* w, float* y, int rows, int n, int k,
                                   int accumulate) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int col = blockIdx.x * (BLOCK / 32) + warp;
    if (col >= n) return;  // the whole warp
    float acc[GEMV_ROWS];
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) acc[r] = 0.0f;
    const uint4* wr = (const uint4*)(w + (size_t)col * k);
    for (int i = lane; i < k / 8; i += 32) {
        const uint4 p = wr[i];
        const unsigned words[4] = {p.x, p.y, p.z, p.w};
        float wf[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wf[2 * j] = __int_as_float((int)(words[j] << 16));
            wf[2 * j + 1] = __int_as_float((int)(words[j] & 0xffff0000u));
        }
#pragma unroll
        for (int r = 0; r < GEMV_ROWS; r++) {
            if (r < rows) {
                const float4* xr = (const float4*)(x + (size_t)r * k + i * 8);
                const float4 a = xr[0], b = xr[1];
                // The rows rounded to bf16, as the cuBLAS path's inputs are.
                const float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int j = 0; j < 8; j++) acc[r] += bf16_float(bf16_bits(xs[j])) * wf[j];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < GEMV_ROWS; r++) {
        const float s = warp_sum(acc[r]);  // every lane takes part
        if (r < rows && lane == 0) y[(size_t)r * n + col] = accumulate ? y[(size_t)r * n + col] + s : s;
    }
}
