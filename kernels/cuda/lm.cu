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

// Attention of one row and one head (grid: rows x heads) over the sink and
// positions 0..=pos[r] of the row's sequence, read through its page table
// (`pages + table_off[r]`). Scores go to `scores` (rows x heads x stride),
// then softmax, then the weighted sum of V.
extern "C" __global__ void lm_attention(const float* qkv, const float* kcache, const float* vcache,
                                        const float* bos_k, const float* bos_v, const int* pos,
                                        const int* pages, const int* table_off, float* scores, float* out,
                                        int hidden, int head_dim, int page_tokens, long long layer_slots, int stride) {
    __shared__ float red[BLOCK];
    int r = blockIdx.x, head = blockIdx.y;
    int ctx = pos[r] + 2;
    const float* q = qkv + (size_t)r * 3 * hidden + head * head_dim;
    const int* table = pages + table_off[r];
    float* sc = scores + ((size_t)r * gridDim.y + head) * stride;
    float scale = 1.0f / sqrtf((float)head_dim);
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < ctx; j += BLOCK) {
        const float* k;
        if (j == 0) {
            k = bos_k + head * head_dim;
        } else {
            int p = j - 1;
            long long s = layer_slots + (long long)table[p / page_tokens] * page_tokens + p % page_tokens;
            k = kcache + (size_t)s * hidden + head * head_dim;
        }
        float d = 0.0f;
        for (int i = 0; i < head_dim; i++) d += q[i] * k[i];
        d *= scale;
        sc[j] = d;
        mx = fmaxf(mx, d);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < ctx; j += BLOCK) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    for (int d = threadIdx.x; d < head_dim; d += BLOCK) {
        float acc = sc[0] * bos_v[head * head_dim + d];
        for (int p = 0; p + 1 < ctx; p++) {
            long long s = layer_slots + (long long)table[p / page_tokens] * page_tokens + p % page_tokens;
            acc += sc[p + 1] * vcache[(size_t)s * hidden + head * head_dim + d];
        }
        out[(size_t)r * hidden + head * head_dim + d] = acc / sum;
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
