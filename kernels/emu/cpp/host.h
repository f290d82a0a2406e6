// Host emulation of the CUDA C subset kernels/cuda uses, so the same
// sources compile as C++ and run on the CPU: a block's BLOCK threads are
// real threads meeting at a barrier for __syncthreads, blocks run one after
// another (last first), and __shared__ arrays are function statics (shared
// by the block's threads; one launch at a time, so blocks never overlap).
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

struct emu_uint3 {
    unsigned x, y, z;
};

thread_local emu_uint3 threadIdx;
thread_local emu_uint3 blockIdx;
static emu_uint3 gridDim;
static std::barrier<>* emu_barrier;

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

static inline void __syncthreads() { emu_barrier->arrive_and_wait(); }
static inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
static inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}
using std::isfinite;

// Vector types of the sources (16-byte loads and stores).
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

// Warps: BLOCK / 32 groups of 32 threads, each meeting at its own barrier
// for the warp-collective operations below (shuffles and the tensor-core
// product), which exchange values through a per-warp scratch. As on a GPU,
// every lane of a warp must take part.
static std::barrier<>* emu_warp_barrier[BLOCK / 32];
static unsigned emu_warp_words[BLOCK / 32][32][8];

static inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp_barrier[threadIdx.x / 32]->arrive_and_wait(); }

static inline float __shfl_xor_sync(unsigned, float v, int mask) {
    unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    std::memcpy(&emu_warp_words[w][l][0], &v, 4);
    __syncwarp();
    float r;
    std::memcpy(&r, &emu_warp_words[w][l ^ (unsigned)mask][0], 4);
    __syncwarp();
    return r;
}

static inline float emu_bf16(unsigned word, int half) {
    return __int_as_float((int)(((word >> (16 * half)) & 0xffffu) << 16));
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: each lane deposits its
// row address; r[i] is read from matrix i's rows (lanes 8i .. 8i+7).
static inline void emu_ldmatrix_x4(unsigned* r, const unsigned short* row, bool trans) {
    unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    std::memcpy(&emu_warp_words[w][l][0], &row, sizeof row);
    __syncwarp();
    auto at = [&](unsigned lane) {
        const unsigned short* p;
        std::memcpy(&p, &emu_warp_words[w][lane][0], sizeof p);
        return p;
    };
    unsigned g = l / 4, t = l % 4;
    for (unsigned i = 0; i < 4; i++) {
        unsigned short lo, hi;
        if (trans) {
            lo = at(8 * i + 2 * t)[g];
            hi = at(8 * i + 2 * t + 1)[g];
        } else {
            lo = at(8 * i + g)[2 * t];
            hi = at(8 * i + g)[2 * t + 1];
        }
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
    __syncwarp();
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d = c: each lane
// deposits its A (4 words) and B (2 words) fragments, then computes its four
// outputs from the whole warp's (PTX ISA's fragment layouts).
static inline void emu_mma_bf16_16816(float* c, const unsigned* a, const unsigned* b) {
    unsigned w = threadIdx.x / 32, l = threadIdx.x % 32;
    for (int i = 0; i < 4; i++) emu_warp_words[w][l][i] = a[i];
    emu_warp_words[w][l][4] = b[0];
    emu_warp_words[w][l][5] = b[1];
    __syncwarp();
    auto A = [&](int row, int k) {
        int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return emu_bf16(emu_warp_words[w][(row % 8) * 4 + (k % 8) / 2][reg], k % 2);
    };
    auto B = [&](int k, int col) {
        return emu_bf16(emu_warp_words[w][col * 4 + (k % 8) / 2][4 + (k >= 8 ? 1 : 0)], k % 2);
    };
    unsigned g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
        int row = (int)g + (i >= 2 ? 8 : 0), col = (int)(2 * t) + (i % 2);
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc += A(row, k) * B(k, col);
        c[i] = acc;
    }
    __syncwarp();
}

// Calls `f` with its arguments read from `params` as cuLaunchKernel does:
// params[i] points at the i-th argument's value.
template <typename... A, std::size_t... I>
static void emu_call_impl(void (*f)(A...), void** params, std::index_sequence<I...>) {
    f(*static_cast<A*>(params[I])...);
}
template <typename... A>
static void emu_call(void (*f)(A...), void** params) {
    emu_call_impl(f, params, std::index_sequence_for<A...>{});
}

struct emu_entry {
    const char* name;
    void (*thunk)(void**);
};

static std::mutex emu_lock;

static int emu_run(void (*thunk)(void**), unsigned gx, unsigned gy, unsigned gz, void** params) {
    std::lock_guard<std::mutex> guard(emu_lock);
    gridDim = {gx, gy, gz};
    std::barrier<> bar(BLOCK);
    emu_barrier = &bar;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    for (unsigned w = 0; w < BLOCK / 32; w++) {
        warps.push_back(std::make_unique<std::barrier<>>(32));
        emu_warp_barrier[w] = warps.back().get();
    }
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < BLOCK; t++) {
        threads.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            // Blocks in reverse order: a GPU runs them in any order, so a
            // kernel whose result depends on block order shows up here.
            for (unsigned z = gz; z-- > 0;)
                for (unsigned y = gy; y-- > 0;)
                    for (unsigned x = gx; x-- > 0;) {
                        blockIdx = {x, y, z};
                        thunk(params);
                        // A block ends for all its threads before the next begins.
                        bar.arrive_and_wait();
                    }
        });
    }
    for (auto& th : threads) th.join();
    emu_barrier = nullptr;
    return 0;
}
