// The DiT-shaped video model (engine/src/gpu/dit.rs): what its blocks need
// beyond the cuBLAS products. Activations between products are bf16 with
// an f32 residual stream; attention is one fused kernel.
//
// Layouts: a chunk's hidden states are token-major rows of `h` floats;
// attention operands are head-major, [head][token][HD] bf16, so that each
// head's keys are contiguous rows of HD.

#ifndef HD
#define HD 128
#endif
#ifndef FA_Q
#define FA_Q 64
#endif
#ifndef FA_K
#define FA_K 64
#endif
#ifndef FA_KA
#define FA_KA 32
#endif
// Shared-memory row strides, padded so that the fragment loads of a warp
// hit distinct banks: a K (or V) row of HD bf16 plus 16 bytes (the 8 rows
// a fragment load or an ldmatrix reads start 4 banks apart); a transposed
// V row of FA_K keys plus 16 bytes.
#define KV_STRIDE (HD + 8)
#define VT_STRIDE (FA_K + 8)

// Attention of a batch of members (grid.z), each with its own queries and
// keys, ragged: out = softmax(q kᵀ · scale) v per head (grid.y) and per
// tile of FA_Q queries (grid.x; tiles past a member's queries exit).
//
// Flash-attention style: 4 warps own 16 query rows each, with their Q
// fragments in registers; K and V tiles of FA_K keys are staged in shared
// memory through registers (V transposed, so that both products read
// 32-bit words); scores and the running output stay in mma accumulators;
// the softmax is online (running row maximum and sum, the output rescaled
// when the maximum moves); keys past the member's count are masked to
// -inf. The products run on the tensor cores (bf16 in, f32 accumulate); the
// scores of one tile become the A operand of the P·V product without
// leaving registers (the m16n8k16 accumulator and A layouts line up
// pairwise). Measured on an H100: docs/benchmarks/gpu.md, "The DiT on the GPU".
//
// `meta` (i64, kernels::dit::META per member): q offset, q head stride,
// queries, k/v offset, k/v head stride, keys, output offset, spare; the
// output is token-major with rows of `o_stride` elements, head h at
// column h·HD. `scale_log2` is the softmax scale times log2(e).
extern "C" __global__ void dit_attention(const unsigned short* q, const unsigned short* k,
                                         const unsigned short* v, unsigned short* o, const long long* meta,
                                         float scale_log2, int o_stride) {
    const long long* m = meta + (size_t)blockIdx.z * 8;
    const int nq = (int)m[2], nk = (int)m[5];
    const int q0 = blockIdx.x * FA_Q;
    if (q0 >= nq) return;  // the whole block: before any barrier
    const int head = blockIdx.y;
    const unsigned short* qh = q + m[0] + (long long)head * m[1];
    const unsigned short* kh = k + m[3] + (long long)head * m[4];
    const unsigned short* vh = v + m[3] + (long long)head * m[4];

    __shared__ __align__(16) unsigned short ks[FA_K * KV_STRIDE];
    __shared__ __align__(16) unsigned short vt[HD * VT_STRIDE];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;

    unsigned qa[HD / 16][4];
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
        const int c = s * 16 + 2 * t;
        qa[s][0] = r0 < nq ? *(const unsigned*)(qh + (size_t)r0 * HD + c) : 0u;
        qa[s][1] = r1 < nq ? *(const unsigned*)(qh + (size_t)r1 * HD + c) : 0u;
        qa[s][2] = r0 < nq ? *(const unsigned*)(qh + (size_t)r0 * HD + c + 8) : 0u;
        qa[s][3] = r1 < nq ? *(const unsigned*)(qh + (size_t)r1 * HD + c + 8) : 0u;
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;

    for (int k0 = 0; k0 < nk; k0 += FA_K) {
        __syncthreads();  // every warp is done with the previous tile
        // K rows as they are (consecutive threads: consecutive 16 bytes of
        // a row); V transposed (consecutive threads: consecutive keys, so
        // the 2-byte stores of a warp fall in distinct banks).
        for (int i = threadIdx.x; i < FA_K * (HD / 8); i += BLOCK) {
            const int row = i / (HD / 8), c = i % (HD / 8);
            uint4 kv = {0u, 0u, 0u, 0u};
            if (k0 + row < nk) kv = *(const uint4*)(kh + (size_t)(k0 + row) * HD + c * 8);
            *(uint4*)(ks + row * KV_STRIDE + c * 8) = kv;
        }
        for (int i = threadIdx.x; i < FA_K * (HD / 8); i += BLOCK) {
            const int row = i % FA_K, c = i / FA_K;
            uint4 vv = {0u, 0u, 0u, 0u};
            if (k0 + row < nk) vv = *(const uint4*)(vh + (size_t)(k0 + row) * HD + c * 8);
            const unsigned words[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                vt[(c * 8 + 2 * j) * VT_STRIDE + row] = (unsigned short)(words[j] & 0xffffu);
                vt[(c * 8 + 2 * j + 1) * VT_STRIDE + row] = (unsigned short)(words[j] >> 16);
            }
        }
        __syncthreads();

        // Scores of this warp's 16 rows against the tile's FA_K keys.
        float s[FA_K / 8][4];
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const unsigned short* kr = ks + (n * 8 + g) * KV_STRIDE + kk * 16 + 2 * t;
                const unsigned b[2] = {*(const unsigned*)kr, *(const unsigned*)(kr + 8)};
                mma_bf16(s[n], qa[kk], b);
            }
        }

        // Online softmax, in the log2 domain.
        float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
            const int col = k0 + n * 8 + 2 * t;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const bool in = col + j < nk;
                s[n][j] = in ? s[n][j] * scale_log2 : -INFINITY;
                s[n][2 + j] = in ? s[n][2 + j] * scale_log2 : -INFINITY;
                tmax0 = fmaxf(tmax0, s[n][j]);
                tmax1 = fmaxf(tmax1, s[n][2 + j]);
            }
        }
        // Every tile holds at least one key (k0 < nk), so the new maxima
        // are finite and exp2 of a masked score is 0.
        const float new0 = fmaxf(max0, quad_max(tmax0)), new1 = fmaxf(max1, quad_max(tmax1));
        const float alpha0 = exp2f(max0 - new0), alpha1 = exp2f(max1 - new1);
        max0 = new0;
        max1 = new1;
        float ts0 = 0.0f, ts1 = 0.0f;
#pragma unroll
        for (int n = 0; n < FA_K / 8; n++) {
            s[n][0] = exp2f(s[n][0] - new0);
            s[n][1] = exp2f(s[n][1] - new0);
            s[n][2] = exp2f(s[n][2] - new1);
            s[n][3] = exp2f(s[n][3] - new1);
            ts0 += s[n][0] + s[n][1];
            ts1 += s[n][2] + s[n][3];
        }
        sum0 = sum0 * alpha0 + ts0;
        sum1 = sum1 * alpha1 + ts1;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            acc[d][0] *= alpha0;
            acc[d][1] *= alpha0;
            acc[d][2] *= alpha1;
            acc[d][3] *= alpha1;
        }

        // acc += P · V, 16 keys per step.
#pragma unroll
        for (int kk = 0; kk < FA_K / 16; kk++) {
            const unsigned pa[4] = {
                pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const unsigned short* vr = vt + (d * 8 + g) * VT_STRIDE + kk * 16 + 2 * t;
                const unsigned b[2] = {*(const unsigned*)vr, *(const unsigned*)(vr + 8)};
                mma_bf16(acc[d], pa, b);
            }
        }
    }

    // Each lane summed its own columns: the row sums are the quads' sums.
    const float inv0 = 1.0f / quad_sum(sum0), inv1 = 1.0f / quad_sum(sum1);
    unsigned short* out = o + m[6] + head * HD + 2 * t;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        if (r0 < nq) *(unsigned*)(out + (size_t)r0 * o_stride + d * 8) = pack_bf16x2(acc[d][0] * inv0, acc[d][1] * inv0);
        if (r1 < nq) *(unsigned*)(out + (size_t)r1 * o_stride + d * 8) = pack_bf16x2(acc[d][2] * inv1, acc[d][3] * inv1);
    }
}

// `dit_attention` with the tile loads off the critical path: the same
// arguments and result; K and V tiles of FA_KA keys are staged in shared
// memory by asynchronous copies (cp.async), two stages deep (the next tile
// loads while this one is computed), and read into fragments with ldmatrix
// (V transposed on the way, where `dit_attention` transposes with 2-byte
// stores); 168 registers and 35 KB of shared memory, so 3 blocks per SM.
// Not yet measured on a GPU (it passes the emulator's checks and compiles
// for sm_90 without spills): `engine gpu-bench` times both, and
// `--dit-attention async` makes the DiT use this one.
extern "C" __global__ void __launch_bounds__(BLOCK, 3)
    dit_attention_async(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                        unsigned short* o, const long long* meta, float scale_log2, int o_stride) {
    const long long* m = meta + (size_t)blockIdx.z * 8;
    const int nq = (int)m[2], nk = (int)m[5];
    const int q0 = blockIdx.x * FA_Q;
    if (q0 >= nq) return;  // the whole block: before any barrier
    const int head = blockIdx.y;
    const unsigned short* qh = q + m[0] + (long long)head * m[1];
    const unsigned short* kh = k + m[3] + (long long)head * m[4];
    const unsigned short* vh = v + m[3] + (long long)head * m[4];

    __shared__ __align__(16) unsigned short ks[2][FA_KA * KV_STRIDE];
    __shared__ __align__(16) unsigned short vs[2][FA_KA * KV_STRIDE];

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;

    // Stage `tile` into buffer `buf`: FA_KA rows of HD, 16 bytes a copy.
    auto stage = [&](int tile, int buf) {
        const int k0 = tile * FA_KA;
        for (int i = threadIdx.x; i < FA_KA * (HD / 8); i += BLOCK) {
            const int row = i / (HD / 8), c = i % (HD / 8);
            const bool in = k0 + row < nk;
            const size_t src = (size_t)(in ? k0 + row : 0) * HD + c * 8;
            cp_async16(&ks[buf][row * KV_STRIDE + c * 8], kh + src, in);
            cp_async16(&vs[buf][row * KV_STRIDE + c * 8], vh + src, in);
        }
        cp_async_commit();
    };
    stage(0, 0);

    unsigned qa[HD / 16][4];
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
        const int c = s * 16 + 2 * t;
        qa[s][0] = r0 < nq ? *(const unsigned*)(qh + (size_t)r0 * HD + c) : 0u;
        qa[s][1] = r1 < nq ? *(const unsigned*)(qh + (size_t)r1 * HD + c) : 0u;
        qa[s][2] = r0 < nq ? *(const unsigned*)(qh + (size_t)r0 * HD + c + 8) : 0u;
        qa[s][3] = r1 < nq ? *(const unsigned*)(qh + (size_t)r1 * HD + c + 8) : 0u;
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;
    // This lane's ldmatrix row: matrix lane / 8, row lane % 8.
    const int lm = lane / 8, lr = lane % 8;

    const int tiles = (nk + FA_KA - 1) / FA_KA;
    for (int tile = 0; tile < tiles; tile++) {
        const int buf = tile & 1, k0 = tile * FA_KA;
        if (tile + 1 < tiles) {
            stage(tile + 1, buf ^ 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this tile's copies, from every thread, have landed
        const unsigned short* kt = ks[buf];
        const unsigned short* vt = vs[buf];

        // Scores of this warp's 16 rows against the tile's FA_KA keys; one
        // ldmatrix gives the B fragments of two k-steps of one key group.
        float s[FA_KA / 8][4];
#pragma unroll
        for (int n = 0; n < FA_KA / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk += 2) {
                unsigned b[4];
                ldmatrix_x4<false>(b, kt + (n * 8 + lr) * KV_STRIDE + kk * 16 + lm * 8);
                mma_bf16(s[n], qa[kk], b);
                mma_bf16(s[n], qa[kk + 1], b + 2);
            }
        }

        // Online softmax, in the log2 domain.
        float tmax0 = -INFINITY, tmax1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < FA_KA / 8; n++) {
            const int col = k0 + n * 8 + 2 * t;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const bool in = col + j < nk;
                s[n][j] = in ? s[n][j] * scale_log2 : -INFINITY;
                s[n][2 + j] = in ? s[n][2 + j] * scale_log2 : -INFINITY;
                tmax0 = fmaxf(tmax0, s[n][j]);
                tmax1 = fmaxf(tmax1, s[n][2 + j]);
            }
        }
        // Every tile holds at least one key (k0 < nk), so the new maxima
        // are finite and exp2 of a masked score is 0.
        const float new0 = fmaxf(max0, quad_max(tmax0)), new1 = fmaxf(max1, quad_max(tmax1));
        const float alpha0 = exp2f(max0 - new0), alpha1 = exp2f(max1 - new1);
        max0 = new0;
        max1 = new1;
        float ts0 = 0.0f, ts1 = 0.0f;
#pragma unroll
        for (int n = 0; n < FA_KA / 8; n++) {
            s[n][0] = exp2f(s[n][0] - new0);
            s[n][1] = exp2f(s[n][1] - new0);
            s[n][2] = exp2f(s[n][2] - new1);
            s[n][3] = exp2f(s[n][3] - new1);
            ts0 += s[n][0] + s[n][1];
            ts1 += s[n][2] + s[n][3];
        }
        sum0 = sum0 * alpha0 + ts0;
        sum1 = sum1 * alpha1 + ts1;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            acc[d][0] *= alpha0;
            acc[d][1] *= alpha0;
            acc[d][2] *= alpha1;
            acc[d][3] *= alpha1;
        }

        // acc += P · V, 16 keys per step; one transposed ldmatrix gives the
        // B fragments of two 8-wide column groups of V.
#pragma unroll
        for (int kk = 0; kk < FA_KA / 16; kk++) {
            const unsigned pa[4] = {
                pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]),
            };
#pragma unroll
            for (int d = 0; d < HD / 8; d += 2) {
                // Matrices: keys +0..7 and +8..15 of column group d, then d + 1.
                unsigned b[4];
                ldmatrix_x4<true>(b, vt + (kk * 16 + (lm % 2) * 8 + lr) * KV_STRIDE + (d + lm / 2) * 8);
                mma_bf16(acc[d], pa, b);
                mma_bf16(acc[d + 1], pa, b + 2);
            }
        }
        __syncthreads();  // every warp is done with `buf` before it is refilled
    }

    // Each lane summed its own columns: the row sums are the quads' sums.
    const float inv0 = 1.0f / quad_sum(sum0), inv1 = 1.0f / quad_sum(sum1);
    unsigned short* out = o + m[6] + head * HD + 2 * t;
#pragma unroll
    for (int d = 0; d < HD / 8; d++) {
        if (r0 < nq) *(unsigned*)(out + (size_t)r0 * o_stride + d * 8) = pack_bf16x2(acc[d][0] * inv0, acc[d][1] * inv0);
        if (r1 < nq) *(unsigned*)(out + (size_t)r1 * o_stride + d * 8) = pack_bf16x2(acc[d][2] * inv1, acc[d][3] * inv1);
    }
}

// Adaptive LayerNorm (DiT's adaLN): one block per row of `x` (f32, `h`
// wide), normalised without affine (eps 1e-6), then x̂ · (1 + scale) + shift,
// written as bf16 for the next product.
extern "C" __global__ void dit_modulate(const float* x, const float* shift, const float* scale,
                                        unsigned short* out, int h) {
    __shared__ float red[BLOCK];
    const float* row = x + (size_t)blockIdx.x * h;
    float s = 0.0f;
    for (int i = threadIdx.x; i < h; i += BLOCK) s += row[i];
    const float mean = block_sum(s, red) / (float)h;
    float v = 0.0f;
    for (int i = threadIdx.x; i < h; i += BLOCK) {
        const float d = row[i] - mean;
        v += d * d;
    }
    const float inv = 1.0f / sqrtf(block_sum(v, red) / (float)h + 1e-6f);
    unsigned short* o = out + (size_t)blockIdx.x * h;
    for (int i = threadIdx.x; i < h; i += BLOCK)
        o[i] = bf16_bits((row[i] - mean) * inv * (1.0f + scale[i]) + shift[i]);
}

// Token-major bf16 rows to head-major: row r's `heads · HD` values starting
// at column `col` of `src` (rows of `src_stride`) go to dst + dst_off + head
// · head_stride + r · HD. One block per row.
extern "C" __global__ void dit_to_heads(const unsigned short* src, int src_stride, int col, unsigned short* dst,
                                        long long dst_off, long long head_stride, int heads) {
    const int r = blockIdx.x;
    const unsigned short* s = src + (size_t)r * src_stride + col;
    for (int i = threadIdx.x; i < heads * (HD / 8); i += BLOCK) {
        const int head = i / (HD / 8), c = i % (HD / 8);
        *(uint4*)(dst + dst_off + head * head_stride + (long long)r * HD + c * 8) = *(const uint4*)(s + head * HD + c * 8);
    }
}

// x = y (bf16 to f32): a chunk's input latents into the residual stream.
extern "C" __global__ void dit_set(float* x, const unsigned short* y, long long n) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) x[i] = bf16_float(y[i]);
}

// GELU (tanh form) of bf16 values, in place.
extern "C" __global__ void dit_gelu(unsigned short* x, long long n) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const float v = bf16_float(x[i]);
    const float u = 0.7978845608f * (v + 0.044715f * v * v * v);
    x[i] = bf16_bits(0.5f * v * (1.0f + tanhf(u)));
}

// The residual stream: x += gate ⊙ y per row (y bf16, gate per column; a
// null gate is 1).
extern "C" __global__ void dit_gated_add(float* x, const unsigned short* y, const float* gate, int h, long long n) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    const float g = gate ? gate[i % h] : 1.0f;
    x[i] += g * bf16_float(y[i]);
}

// n bf16 values uniform in [-amp, amp) from a counter hash of (seed, index):
// random weights and random cached keys/values without a host upload.
extern "C" __global__ void dit_fill(unsigned short* x, long long n, unsigned seed, float amp) {
    const long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= n) return;
    unsigned h = (unsigned)i * 0x9E3779B9u ^ (unsigned)(i >> 32) * 0x85EBCA6Bu ^ seed * 0xC2B2AE35u;
    h ^= h >> 16;
    h *= 0x7FEB352Du;
    h ^= h >> 15;
    h *= 0x846CA68Bu;
    h ^= h >> 16;
    x[i] = bf16_bits(((float)(h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * amp);
}
