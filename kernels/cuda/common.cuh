// Shared device helpers. Every kernel in this directory is launched with
// BLOCK threads per block (a compile-time define, 128 unless set) and uses
// shared-memory reductions only (no warp shuffles), so the same source also
// runs in the host emulator (kernels/emu) that the tests use.

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
