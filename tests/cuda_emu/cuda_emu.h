/* cuda_emu.h: a small CPU emulation of the CUDA features colibri's kernels use, so that
 * cuda/routing.cu and cuda/moe_gemm.cu compile with g++ (C++20) and run on a machine without
 * a GPU, under AddressSanitizer and UndefinedBehaviorSanitizer. It checks the kernels'
 * indexing, barriers and data flow, not their speed or the hardware's rounding.
 *
 * Model: blocks run one after another; the threads of a block are std::threads;
 * __syncthreads is a std::barrier over the block, __ballot_sync a barrier over the warp;
 * `__shared__` variables become function-local statics (one block lives at a time); atomics
 * are GCC __atomic builtins. A WMMA fragment holds the whole 16x16 tile (so element-wise
 * operations over x[0..num_elements) stay valid), but only lane 0 of the warp loads,
 * multiplies (in float) and stores it; the other lanes' fragments stay as filled, which is
 * invisible because only lane 0 stores. Loads and stores check the alignment rules of the
 * real API (pointer 256-bit aligned, ldm a multiple of 16 bytes) in every lane.
 *
 * Include this before the .cu file; compile with -I<cuda>/include for cuda_fp16.h.
 */
#ifndef COLIBRI_CUDA_EMU_H
#define COLIBRI_CUDA_EMU_H

#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace emu {
struct Warp {
    std::unique_ptr<std::barrier<>> bar;
    unsigned vals[32];
};
inline dim3 block_idx, block_dim, grid_dim;
inline thread_local dim3 thread_idx;
inline std::barrier<> *block_barrier = nullptr;
inline std::vector<Warp> *warps = nullptr;

[[noreturn]] inline void die(const char *what) {
    std::fprintf(stderr, "cuda_emu: %s\n", what);
    std::abort();
}

/* Run kernel(args...) over grid x block, blocks in order, a block's threads concurrently. */
template <class F>
void launch(dim3 grid, dim3 block, F &&kernel) {
    const unsigned n = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || n % 32 != 0) die("launch: 1-D blocks of whole warps only");
    grid_dim = grid;
    block_dim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                block_idx = dim3(bx, by, bz);
                std::barrier<> bar(n);
                std::vector<Warp> ws(n / 32);
                for (auto &w : ws) w.bar = std::make_unique<std::barrier<>>(32);
                block_barrier = &bar;
                warps = &ws;
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned t = 0; t < n; t++)
                    threads.emplace_back([t, &kernel] {
                        thread_idx = dim3(t, 0, 0);
                        kernel();
                    });
                for (auto &th : threads) th.join();
            }
}
}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

inline unsigned __ballot_sync(unsigned mask, int pred) {
    if (mask != 0xffffffffu) emu::die("__ballot_sync: only full-warp masks are emulated");
    emu::Warp &w = (*emu::warps)[threadIdx.x / 32];
    w.vals[threadIdx.x % 32] = pred ? 1u : 0u;
    w.bar->arrive_and_wait();
    unsigned m = 0;
    for (int i = 0; i < 32; i++) m |= w.vals[i] << i;
    w.bar->arrive_and_wait(); /* nobody overwrites vals before everyone has read them */
    return m;
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicCAS(int *p, int cmp, int val) {
    __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "only m16n16k16 is emulated");
    static constexpr int num_elements = 256;
    T x[256] = {}; /* a, accumulator: [row][col]; b: [k][n] */
};

inline void check_ptr(const void *p, unsigned ldm, unsigned elem) {
    if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) emu::die("wmma: pointer not 256-bit aligned");
    if ((ldm * elem) % 16 != 0) emu::die("wmma: ldm not a multiple of 16 bytes");
}

template <class Use, class T, class L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, T v) {
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

inline void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __half, row_major> &f,
                             const __half *p, unsigned ldm) {
    check_ptr(p, ldm, 2);
    if (threadIdx.x % 32 != 0) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = p[r * ldm + c];
}

inline void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __half, col_major> &f,
                             const __half *p, unsigned ldm) {
    check_ptr(p, ldm, 2);
    if (threadIdx.x % 32 != 0) return;
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < 16; n++) f.x[k * 16 + n] = p[n * ldm + k];
}

inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, __half, row_major> &a,
                     const fragment<matrix_b, 16, 16, 16, __half, col_major> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c) {
    if (threadIdx.x % 32 != 0) return;
    float out[256];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[m * 16 + n];
            for (int k = 0; k < 16; k++)
                s += __half2float(a.x[m * 16 + k]) * __half2float(b.x[k * 16 + n]);
            out[m * 16 + n] = s;
        }
    for (int i = 0; i < 256; i++) d.x[i] = out[i];
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t layout) {
    check_ptr(p, ldm, 4);
    if (layout != mem_row_major) emu::die("wmma: only mem_row_major stores are emulated");
    if (threadIdx.x % 32 != 0) return;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) p[r * ldm + c] = f.x[r * 16 + c];
}
}  // namespace wmma
}  // namespace nvcuda

#endif
