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
