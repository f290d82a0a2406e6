// Shared device helpers. Every kernel in this directory is launched with
// BLOCK threads per block (a compile-time define, 128 unless set). Warp
// shuffles and the tensor-core product go through the helpers below, which
// the host emulator (kernels/emu) that the tests use implements too, so the
// same source runs there.

#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Sum of `v` over the block's threads; every thread gets the result.
// `red` is BLOCK floats of shared scratch. Every thread must call it.
__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

// Maximum of `v` over the block's threads, as `block_sum`.
__device__ float block_max(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

// The cpu backend's dot product: 16 partial sums in lane order, combined
// pairwise. Used where a result selects something (top-k of block scores),
// so that the GPU selects what the CPU selects.
__device__ float dot_lanes(const float* a, const float* b, int n) {
    float acc[16];
    for (int i = 0; i < 16; i++) acc[i] = 0.0f;
    int full = n - n % 16;
    for (int i = 0; i < full; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int i = full; i < n; i++) acc[i - full] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

// fp8 e4m3 round trip: 3 mantissa bits, saturating at +-448, subnormal
// steps below 2^-6 (the cpu backend's `fp8`).
__device__ float fp8_e4m3(float x) {
    if (x == 0.0f || !isfinite(x)) return 0.0f;
    float c = fminf(fmaxf(x, -448.0f), 448.0f);
    float e = fmaxf(floorf(log2f(fabsf(c))), -6.0f);
    float step = exp2f(e - 3.0f);
    return roundf(c / step) * step;
}

// f32 to bf16 bits, round to nearest even (NaN stays NaN).
__device__ unsigned short bf16_bits(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Activations to bf16 for a cuBLAS product.
extern "C" __global__ void to_bf16(const float* x, unsigned short* y, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) y[i] = bf16_bits(x[i]);
}

// x += y, elementwise.
extern "C" __global__ void add_into(float* x, const float* y, int n) {
    int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// out[r] = x[idx[r]], rows of `width`.
extern "C" __global__ void gather_rows(const float* x, const int* idx, float* out, int width) {
    int r = blockIdx.x;
    const float* src = x + (size_t)idx[r] * width;
    for (int i = threadIdx.x; i < width; i += BLOCK) out[(size_t)r * width + i] = src[i];
}

// Sum and maximum over the 4 lanes of a quad (lanes 4g .. 4g+3): the lanes
// that hold one row of an mma accumulator.
__device__ inline float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Sum over the warp's 32 lanes; every lane gets it.
__device__ inline float warp_sum(float v) {
    for (int m = 16; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// Two floats as packed bf16 (lo in the low half), round to nearest even.
__device__ inline unsigned pack_bf16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)bf16_bits(lo) | ((unsigned)bf16_bits(hi) << 16);
#endif
}

// bf16 bits to float.
__device__ inline float bf16_float(unsigned short b) { return __int_as_float((int)((unsigned)b << 16)); }

// c += a · b on the tensor cores, one warp: a 16×16 bf16 A fragment (4
// words), a 16×8 bf16 B fragment (2 words), a 16×8 f32 accumulator, in the
// PTX ISA's m16n8k16 layouts (lane l: g = l / 4, t = l % 4; A words: (g,
// 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..); B words: rows 2t..2t+1
// and 2t+8..2t+9 of column g; C: (g, 2t..2t+1) and (g+8, 2t..2t+1)).
__device__ inline void mma_bf16(float* c, const unsigned* a, const unsigned* b) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    emu_mma_bf16_16816(c, a, b);
#endif
}

// A shared-memory address as the async-copy and ldmatrix instructions take it.
#ifdef __CUDA_ARCH__
__device__ inline unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

// 16 bytes global → shared without passing through registers (cp.async,
// sm_80+), zero-filled when `valid` is false (the source is then not read).
// Completes at cp_async_wait; the emulator copies at once.
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    if (valid)
        std::memcpy(dst, src, 16);
    else
        std::memset(dst, 0, 16);
#endif
}
__device__ inline void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most `N` committed groups are still in flight.
template <int N>
__device__ inline void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Four 8×8 bf16 matrices from shared memory into a warp's fragments
// (ldmatrix .x4): lane l gives the address of row l % 8 of matrix l / 8;
// r[i] gets, of matrix i, row l / 4 at columns 2(l % 4), +1 — or with
// `trans`, rows 2(l % 4), +1 at column l / 4.
template <bool trans>
__device__ inline void ldmatrix_x4(unsigned* r, const unsigned short* row) {
#ifdef __CUDA_ARCH__
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(row)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(smem_addr(row)));
#else
    emu_ldmatrix_x4(r, row, trans);
#endif
}
