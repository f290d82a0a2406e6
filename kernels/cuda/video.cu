// The synthetic chunked video model's kernels. One denoising step of a
// coalesced batch of chunks is one launch of each kernel below over every
// active member together; `meta` holds one row of MI ints per member and
// `mparam` one row of MF floats (layouts in kernels/src/lib.rs, `video`).
//
// Buffers: `x` holds every member's chunk latent (tokens x CHANNELS);
// `keys`/`vals` each member's context tokens' and then its chunk tokens'
// projections (tokens x DIM) from its `kv_off`; `q` the chunk tokens'
// queries, indexed like `x`.

#ifndef CHANNELS
#define CHANNELS 8
#endif
#ifndef DIM
#define DIM 32
#endif
#ifndef HIDDEN
#define HIDDEN 32
#endif
#define MI 8
#define MF 12

// out[dst[i]] = src[src_idx[i]] . w (CHANNELS -> DIM, w row-major
// CHANNELS x DIM), fp8 round trip where flag[i] says so. One thread per token.
extern "C" __global__ void video_project(const float* src, const int* src_idx, const int* dst_idx,
                                         const int* flag, const float* w, float* out, int count) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= count) return;
    const float* s = src + (size_t)src_idx[i] * CHANNELS;
    float* o = out + (size_t)dst_idx[i] * DIM;
    float acc[DIM];
    for (int j = 0; j < DIM; j++) acc[j] = 0.0f;
    for (int c = 0; c < CHANNELS; c++)
        for (int j = 0; j < DIM; j++) acc[j] += s[c] * w[c * DIM + j];
    for (int j = 0; j < DIM; j++) o[j] = flag[i] ? fp8_e4m3(acc[j]) : acc[j];
}

// Block sparsity, one block per member: the context's key blocks (one per
// latent-frame row, `side` tokens) are scored against the mean query; the
// best `keep` blocks (ties to the lower index) and then the chunk's own
// tokens become the member's attention columns `cols[col_off..]`, their
// count `ncols[member]`. `flags` is int scratch indexed like `cols`,
// `bscore` float scratch likewise.
extern "C" __global__ void video_select(const float* q, const float* keys, const int* meta, float* bscore,
                                        int* flags, int* cols, int* ncols) {
    __shared__ float qm[DIM];
    const int* mt = meta + blockIdx.x * MI;
    int x_off = mt[0], n = mt[1], kv_off = mt[2], m = mt[3], side = mt[4], keep = mt[5], col_off = mt[6];
    int blocks = m / side;
    for (int d = threadIdx.x; d < DIM; d += BLOCK) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += q[(size_t)(x_off + i) * DIM + d] / (float)n;
        qm[d] = s;
    }
    __syncthreads();
    float* bs = bscore + col_off;
    for (int b = threadIdx.x; b < blocks; b += BLOCK) {
        float s = 0.0f;
        for (int j = b * side; j < (b + 1) * side; j++) s += dot_lanes(qm, keys + (size_t)(kv_off + j) * DIM, DIM);
        bs[b] = s;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < blocks; b += BLOCK) {
        int rank = 0;
        for (int c = 0; c < blocks; c++)
            if (bs[c] > bs[b] || (bs[c] == bs[b] && c < b)) rank++;
        flags[col_off + b] = rank < keep;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int k = 0;
        for (int b = 0; b < blocks; b++)
            if (flags[col_off + b])
                for (int j = b * side; j < (b + 1) * side; j++) cols[col_off + k++] = j;
        for (int i = 0; i < n; i++) cols[col_off + k++] = m + i;
        ncols[blockIdx.x] = k;
    }
}

// Attention of one chunk token (one block per token: `tok_g` its index in
// `x`, `tok_slot` its member) over its member's columns, with a running
// (online) softmax per thread merged through shared memory.
extern "C" __global__ void video_attend(const float* q, const float* keys, const float* vals, const int* tok_g,
                                        const int* tok_slot, const int* meta, const int* cols, const int* ncols,
                                        float* attn) {
    __shared__ float sm[BLOCK];
    __shared__ float sl[BLOCK];
    __shared__ float sacc[BLOCK * DIM];
    __shared__ float red[BLOCK];
    int g = tok_g[blockIdx.x], slot = tok_slot[blockIdx.x];
    const int* mt = meta + slot * MI;
    int kv_off = mt[2], col_off = mt[6], nc = ncols[slot];
    float qr[DIM], acc[DIM];
    for (int d = 0; d < DIM; d++) {
        qr[d] = q[(size_t)g * DIM + d];
        acc[d] = 0.0f;
    }
    float scale = 1.0f / sqrtf((float)DIM);
    float mx = -INFINITY, l = 0.0f;
    for (int c = threadIdx.x; c < nc; c += BLOCK) {
        size_t j = (size_t)(kv_off + cols[col_off + c]);
        const float* k = keys + j * DIM;
        float s = 0.0f;
        for (int d = 0; d < DIM; d++) s += qr[d] * k[d];
        s *= scale;
        if (s > mx) {
            float r = expf(mx - s);
            l *= r;
            for (int d = 0; d < DIM; d++) acc[d] *= r;
            mx = s;
        }
        float e = expf(s - mx);
        l += e;
        const float* v = vals + j * DIM;
        for (int d = 0; d < DIM; d++) acc[d] += e * v[d];
    }
    sm[threadIdx.x] = mx;
    sl[threadIdx.x] = l;
    for (int d = 0; d < DIM; d++) sacc[threadIdx.x * DIM + d] = acc[d];
    float top = block_max(mx, red);
    for (int d = threadIdx.x; d < DIM; d += BLOCK) {
        float num = 0.0f, den = 0.0f;
        for (int t = 0; t < BLOCK; t++) {
            if (sl[t] == 0.0f) continue;
            float r = expf(sm[t] - top);
            num += sacc[t * DIM + d] * r;
            den += sl[t] * r;
        }
        attn[(size_t)g * DIM + d] = num / den;
    }
}

// The rest of a denoising step, one thread per chunk token: output
// projection of the attention, the tanh MLP (fp8 where the member says),
// the prediction (a smooth field conditioned on the prompt, pulled towards
// what attention saw) and the move along the straight noise-to-prediction
// path: x <- pred + ratio * (x - pred).
extern "C" __global__ void video_update(float* x, const float* attn, const int* tok_g, const int* tok_slot,
                                        const int* meta, const float* mparam, const float* wo, const float* w1,
                                        const float* w2, int count) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= count) return;
    int g = tok_g[i], slot = tok_slot[i];
    const int* mt = meta + slot * MI;
    const float* mp = mparam + slot * MF;
    int local = g - mt[0], side = mt[4], use_fp8 = mt[7] & 1;
    float chunks = mp[CHANNELS], t = mp[CHANNELS + 1], ratio = mp[CHANNELS + 2];
    float* xi = x + (size_t)g * CHANNELS;
    const float* a = attn + (size_t)g * DIM;
    float out[CHANNELS], mlp[CHANNELS], hidden[HIDDEN];
    for (int c = 0; c < CHANNELS; c++) out[c] = 0.0f;
    for (int d = 0; d < DIM; d++)
        for (int c = 0; c < CHANNELS; c++) out[c] += a[d] * wo[d * CHANNELS + c];
    for (int h = 0; h < HIDDEN; h++) hidden[h] = 0.0f;
    for (int c = 0; c < CHANNELS; c++)
        for (int h = 0; h < HIDDEN; h++) hidden[h] += xi[c] * w1[c * HIDDEN + h];
    for (int h = 0; h < HIDDEN; h++) {
        hidden[h] = tanhf(hidden[h]);
        if (use_fp8) hidden[h] = fp8_e4m3(hidden[h]);
    }
    for (int c = 0; c < CHANNELS; c++) mlp[c] = 0.0f;
    for (int h = 0; h < HIDDEN; h++)
        for (int c = 0; c < CHANNELS; c++) mlp[c] += hidden[h] * w2[h * CHANNELS + c];
    int fy = (local / side) % side, fx = local % side, frame = local / (side * side);
    for (int c = 0; c < CHANNELS; c++) {
        float phase = mp[c] * 3.0f + (chunks * 3.0f + (float)frame) * 0.25f;
        float field = sinf((float)fx * 0.35f * mp[(c + 1) % CHANNELS] + (float)fy * 0.3f + phase);
        float pred = 0.55f * field + 0.6f * out[c] + 0.3f * mlp[c] + 0.1f * xi[c] * t;
        xi[c] = pred + ratio * (xi[c] - pred);
    }
}

// RGB frames of every member's chunk (grid.y = member): 4 pixel frames per
// latent frame blending towards the next, 4x bilinear upsampling, a
// sigmoid to bytes. Member frames go to `out + out_off[member]`.
extern "C" __global__ void video_decode(const float* x, const float* to_rgb, const int* meta, const int* out_off,
                                        unsigned char* out) {
    const int* mt = meta + blockIdx.y * MI;
    int x_off = mt[0], n = mt[1], side = mt[4];
    int frames = n / (side * side), px = side * 4;
    int idx = blockIdx.x * BLOCK + threadIdx.x;
    if (idx >= frames * 4 * px * px) return;
    int xx = idx % px, y = (idx / px) % px, sub = (idx / (px * px)) % 4, f = idx / (px * px * 4);
    int next = f + 1 < frames ? f + 1 : frames - 1;
    float a = (float)sub / 4.0f;
    float fy = ((float)y + 0.5f) / 4.0f - 0.5f, fx = ((float)xx + 0.5f) / 4.0f - 0.5f;
    int y0 = (int)fminf(fmaxf(floorf(fy), 0.0f), (float)(side - 1));
    int x0 = (int)fminf(fmaxf(floorf(fx), 0.0f), (float)(side - 1));
    float wy = fy - floorf(fy), wx = fx - floorf(fx);
    int y1 = y0 + 1 < side ? y0 + 1 : side - 1, x1 = x0 + 1 < side ? x0 + 1 : side - 1;
    const float* lat = x + (size_t)x_off * CHANNELS;
    for (int c = 0; c < 3; c++) {
        float bil[2];
        for (int w = 0; w < 2; w++) {
            int fr = w == 0 ? f : next;
            float v[4];
            int ys[4] = {y0, y0, y1, y1}, xs[4] = {x0, x1, x0, x1};
            for (int k = 0; k < 4; k++) {
                const float* tok = lat + (size_t)((fr * side + ys[k]) * side + xs[k]) * CHANNELS;
                float s = 0.0f;
                for (int ch = 0; ch < CHANNELS; ch++) s += tok[ch] * to_rgb[ch * 3 + c];
                v[k] = s;
            }
            float top = v[0] * (1.0f - wx) + v[1] * wx, bot = v[2] * (1.0f - wx) + v[3] * wx;
            bil[w] = top * (1.0f - wy) + bot * wy;
        }
        float val = bil[0] * (1.0f - a) + bil[1] * a;
        out[out_off[blockIdx.y] + ((size_t)(f * 4 + sub) * px * px + (size_t)y * px + xx) * 3 + c] =
            (unsigned char)roundf(255.0f / (1.0f + expf(-1.5f * val)));
    }
}
