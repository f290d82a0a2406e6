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

// Block sparsity, in three launches per step. The context's key blocks
// (one per latent-frame row, `side` tokens) are scored against the mean
// query with the cpu backend's arithmetic, so that the GPU keeps the blocks
// the CPU keeps: the mean summed in token order, each key's `dot_lanes`,
// and each block's score summed over its keys in order. The dot products,
// the only wide part, run over the whole GPU (`video_key_dots`).
//
// video_query_mean: one block per member; `qmean[member]` (DIM floats).
// The block stages BLOCK tokens' queries in shared memory at a time, and
// thread d < DIM adds its dimension's terms in token order from there.
extern "C" __global__ void video_query_mean(const float* q, const int* meta, float* qmean) {
    __shared__ float tile[BLOCK][DIM + 1];
    const int* mt = meta + blockIdx.x * MI;
    int x_off = mt[0], n = mt[1];
    float s = 0.0f;
    for (int i0 = 0; i0 < n; i0 += BLOCK) {
        int rows = n - i0 < BLOCK ? n - i0 : BLOCK;
        for (int e = threadIdx.x; e < BLOCK * DIM; e += BLOCK) {
            int r = e / DIM, d = e % DIM;
            if (r < rows) tile[r][d] = q[(size_t)(x_off + i0 + r) * DIM + d];
        }
        __syncthreads();
        if ((int)threadIdx.x < DIM)
            for (int r = 0; r < rows; r++) s += tile[r][threadIdx.x] / (float)n;
        __syncthreads();
    }
    if ((int)threadIdx.x < DIM) qmean[blockIdx.x * DIM + threadIdx.x] = s;
}

// video_key_dots: grid (key chunks, members), one thread per context key;
// `dots[col_off + i]` = the member's mean query . key i.
extern "C" __global__ void video_key_dots(const float* qmean, const float* keys, const int* meta, float* dots) {
    __shared__ float qm[DIM];
    const int* mt = meta + blockIdx.y * MI;
    int kv_off = mt[2], m = mt[3], col_off = mt[6];
    for (int d = threadIdx.x; d < DIM; d += BLOCK) qm[d] = qmean[blockIdx.y * DIM + d];
    __syncthreads();
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < m) dots[col_off + i] = dot_lanes(qm, keys + (size_t)(kv_off + i) * DIM, DIM);
}

// video_select: one block per member. Block scores from the dots, the best
// `keep` blocks (ties to the lower index), and then the chunk's own tokens
// become the member's attention columns `cols[col_off..]`, their count
// `ncols[member]`. Scores and flags stay in shared memory up to SEL_MAX
// blocks (`flags`, int scratch indexed like `cols`, takes over beyond);
// every thread writes the columns of its run of blocks at once, placed by
// an exclusive scan of the kept counts.
#define SEL_MAX 2048
extern "C" __global__ void video_select(const float* dots, const int* meta, float* bscore, int* flags, int* cols,
                                        int* ncols) {
    __shared__ float s_score[SEL_MAX];
    __shared__ int s_flag[SEL_MAX];
    __shared__ int s_run[BLOCK];
    __shared__ int s_total;
    const int* mt = meta + blockIdx.x * MI;
    int n = mt[1], m = mt[3], side = mt[4], keep = mt[5], col_off = mt[6];
    int blocks = m / side;
    float* bs = blocks <= SEL_MAX ? s_score : bscore + col_off;
    int* fl = blocks <= SEL_MAX ? s_flag : flags + col_off;
    for (int b = threadIdx.x; b < blocks; b += BLOCK) {
        float s = 0.0f;
        for (int j = b * side; j < (b + 1) * side; j++) s += dots[col_off + j];
        bs[b] = s;
    }
    __syncthreads();
    for (int b = threadIdx.x; b < blocks; b += BLOCK) {
        int rank = 0;
        float v = bs[b];
        for (int c = 0; c < blocks; c++)
            if (bs[c] > v || (bs[c] == v && c < b)) rank++;
        fl[b] = rank < keep;
    }
    __syncthreads();
    int run = (blocks + BLOCK - 1) / BLOCK;
    int lo = threadIdx.x * run, hi = lo + run < blocks ? lo + run : blocks;
    int mine = 0;
    for (int b = lo; b < hi; b++) mine += fl[b];
    s_run[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int acc = 0;
        for (int t = 0; t < BLOCK; t++) {
            int c = s_run[t];
            s_run[t] = acc;
            acc += c;
        }
        s_total = acc;
    }
    __syncthreads();
    int at = s_run[threadIdx.x] * side;
    for (int b = lo; b < hi; b++)
        if (fl[b]) {
            for (int j = b * side; j < (b + 1) * side; j++) cols[col_off + at++] = j;
        }
    int kept = s_total * side;
    for (int i = threadIdx.x; i < n; i += BLOCK) cols[col_off + kept + i] = m + i;
    if (threadIdx.x == 0) ncols[blockIdx.x] = kept + n;
}

// Attention of chunk tokens over their member's columns, tiled: a block
// takes AQ query tokens of one member (`tile_tok[blockIdx.x]` indexes the
// first in `tok_g`/`tok_slot`, `tile_cnt` says how many); each thread
// holds two of them (tokens qi and qi + AQ/2) and AP = BLOCK / (AQ/2)
// threads share each pair. The block stages AK columns' keys and values in
// shared memory at a time (rows padded to DIM + 1 floats, so the AP threads
// of a pair reading different rows hit different banks); every shared
// value a thread reads serves both of its queries, which halves the
// shared-memory traffic per query-column pair (the kernel's limit). Each
// thread keeps a running (online) softmax per query over every AP-th column
// of each tile; the AP partial states of a query are merged at the end.
// The columns are split over `gridDim.y` blocks per tile (whole AK tiles
// each), so that a short batch still fills the GPU: each block writes its
// queries' partial softmax (max, sum, unnormalised output: DIM + 2 floats)
// to `partial[(token · splits + split)]`, and `video_attend_merge` combines
// the splits.
#ifndef AQ
#define AQ 64
#endif
#ifndef AK
#define AK 64
#endif
#define AP (BLOCK / (AQ / 2))
extern "C" __global__ void video_attend(const float* q, const float* keys, const float* vals, const int* tok_g,
                                        const int* tok_slot, const int* meta, const int* cols, const int* ncols,
                                        const int* tile_tok, const int* tile_cnt, float* partial) {
    __shared__ float ks[AK][DIM + 1];
    __shared__ float vs[AK][DIM + 1];
    __shared__ float pm[BLOCK];
    __shared__ float pl[BLOCK];
    __shared__ float pacc[BLOCK][DIM + 1];
    int base = tile_tok[blockIdx.x], cnt = tile_cnt[blockIdx.x];
    int qi = threadIdx.x / AP, part = threadIdx.x % AP;
    int slot = tok_slot[base];
    const int* mt = meta + slot * MI;
    int kv_off = mt[2], col_off = mt[6], nc = ncols[slot];
    float qr[2][DIM], acc[2][DIM], mx[2], l[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int t = qi + k * (AQ / 2);
        bool live = t < cnt;
        int g = live ? tok_g[base + t] : 0;
        for (int d = 0; d < DIM; d++) {
            qr[k][d] = live ? q[(size_t)g * DIM + d] : 0.0f;
            acc[k][d] = 0.0f;
        }
        mx[k] = -INFINITY;
        l[k] = 0.0f;
    }
    float scale = 1.0f / sqrtf((float)DIM);
    int splits = gridDim.y;
    int per = ((nc + splits - 1) / splits + AK - 1) / AK * AK;
    int c_begin = blockIdx.y * per, c_end = c_begin + per < nc ? c_begin + per : nc;
    for (int c0 = c_begin; c0 < c_end; c0 += AK) {
        int rows = c_end - c0 < AK ? c_end - c0 : AK;
        for (int e = threadIdx.x; e < AK * DIM; e += BLOCK) {
            int r = e / DIM, d = e % DIM;
            if (r < rows) {
                size_t j = (size_t)(kv_off + cols[col_off + c0 + r]);
                ks[r][d] = keys[j * DIM + d];
                vs[r][d] = vals[j * DIM + d];
            }
        }
        __syncthreads();
        for (int r = part; r < rows; r += AP) {
            float s0 = 0.0f, s1 = 0.0f;
            for (int d = 0; d < DIM; d++) {
                float kd = ks[r][d];
                s0 += qr[0][d] * kd;
                s1 += qr[1][d] * kd;
            }
            float sc[2] = {s0 * scale, s1 * scale}, w[2];
#pragma unroll
            for (int k = 0; k < 2; k++) {
                if (sc[k] > mx[k]) {
                    float f = expf(mx[k] - sc[k]);
                    l[k] *= f;
                    for (int d = 0; d < DIM; d++) acc[k][d] *= f;
                    mx[k] = sc[k];
                }
                w[k] = expf(sc[k] - mx[k]);
                l[k] += w[k];
            }
            for (int d = 0; d < DIM; d++) {
                float vd = vs[r][d];
                acc[0][d] += w[0] * vd;
                acc[1][d] += w[1] * vd;
            }
        }
        __syncthreads();
    }
    // Merge the AP partial states of each query, one query of the pair at
    // a time (the shared scratch holds one state per thread).
#pragma unroll
    for (int k = 0; k < 2; k++) {
        pm[threadIdx.x] = mx[k];
        pl[threadIdx.x] = l[k];
        for (int d = 0; d < DIM; d++) pacc[threadIdx.x][d] = acc[k][d];
        __syncthreads();
        int t = qi + k * (AQ / 2);
        if (t < cnt) {
            int first = qi * AP;
            float top = -INFINITY;
            for (int p = 0; p < AP; p++) top = fmaxf(top, pm[first + p]);
            float* out = partial + ((size_t)(base + t) * splits + blockIdx.y) * (DIM + 2);
            float den = 0.0f;
            for (int p = 0; p < AP; p++)
                if (pl[first + p] != 0.0f) den += pl[first + p] * expf(pm[first + p] - top);
            if (part == 0) {
                out[0] = top;
                out[1] = den;
            }
            for (int d = part; d < DIM; d += AP) {
                float num = 0.0f;
                for (int p = 0; p < AP; p++)
                    if (pl[first + p] != 0.0f) num += pacc[first + p][d] * expf(pm[first + p] - top);
                out[2 + d] = num;
            }
        }
        __syncthreads();
    }
}

// Combines the column splits of `video_attend`: one thread per chunk token
// and dimension; splits that saw no column (sum 0) are skipped.
extern "C" __global__ void video_attend_merge(const float* part, const int* tok_g, int tokens, int splits,
                                              float* attn) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= tokens * DIM) return;
    int t = i / DIM, d = i % DIM;
    const float* p = part + (size_t)t * splits * (DIM + 2);
    float top = -INFINITY;
    for (int s = 0; s < splits; s++)
        if (p[s * (DIM + 2) + 1] != 0.0f) top = fmaxf(top, p[s * (DIM + 2)]);
    float num = 0.0f, den = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float* e = p + s * (DIM + 2);
        if (e[1] == 0.0f) continue;
        float f = expf(e[0] - top);
        num += e[2 + d] * f;
        den += e[1] * f;
    }
    attn[(size_t)tok_g[t] * DIM + d] = num / den;
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
