/* cuda_emu.h: a small CPU emulation of the CUDA features colibri's kernels use, so that
 * cuda/routing.cu and cuda/moe_gemm.cu compile with g++ (C++20) and run on a machine without
 * a GPU, under AddressSanitizer and UndefinedBehaviorSanitizer. It checks the kernels'
 * indexing, barriers and data flow, not their speed or the hardware's rounding.
 *
 * Model: blocks run one after another; the threads of a block are std::threads;
 * __syncthreads is a std::barrier over the block, __ballot_sync and the shuffles a barrier over
 * the warp;
 * `__shared__` variables become function-local statics (one block lives at a time); atomics
 * are GCC __atomic builtins. A WMMA fragment holds the whole 16x16 tile (so element-wise
 * operations over x[0..num_elements) stay valid), but only lane 0 of the warp loads,
 * multiplies (in float) and stores it; the other lanes' fragments stay as filled, which is
 * invisible because only lane 0 stores. Loads and stores check the alignment rules of the
 * real API (pointer 256-bit aligned, ldm a multiple of 16 bytes) in every lane.
 *
 * cp.async (cuda/common.cuh's cb_cp_async16 / _commit / _wait<N>): each copy lands at a random
 * moment the real hardware allows: at issue, or only when the issuing thread waits for its
 * group, so a stage read before its wait and barrier, or overwritten while other warps still
 * read it, gives wrong results (the seed is CB_EMU_SEED, default 1). A thread that ends with
 * copies never waited for aborts. Dynamic shared memory (CB_DYNAMIC_SMEM) is a 128-byte aligned
 * buffer of the size given to launch(), filled with 0xA5 before every block.
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
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#define CB_CUDA_EMU 1

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
inline unsigned char *dyn_smem = nullptr;
inline size_t dyn_smem_size = 0;

struct CpCopy {
    void *dst;
    const void *src;
    bool pred;
};
inline thread_local std::vector<CpCopy> cp_open;                 /* not yet committed */
inline thread_local std::vector<std::vector<CpCopy>> cp_groups;  /* committed, in flight */
inline thread_local std::minstd_rand cp_rng;

inline void cp_land(const CpCopy &c) {
    unsigned char *d = static_cast<unsigned char *>(c.dst);
    if (c.pred)
        std::memcpy(d, c.src, 16);
    else
        std::memset(d, 0, 16);
}

inline unsigned seed() {
    const char *s = std::getenv("CB_EMU_SEED");
    return s ? static_cast<unsigned>(std::strtoul(s, nullptr, 10)) : 1u;
}

[[noreturn]] inline void die(const char *what) {
    std::fprintf(stderr, "cuda_emu: %s\n", what);
    std::abort();
}

/* Run kernel(args...) over grid x block, blocks in order, a block's threads concurrently;
 * smem = bytes of dynamic shared memory. */
template <class F>
void launch(dim3 grid, dim3 block, F &&kernel, size_t smem = 0) {
    const unsigned n = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || n % 32 != 0) die("launch: 1-D blocks of whole warps only");
    grid_dim = grid;
    block_dim = block;
    std::unique_ptr<unsigned char, decltype(&std::free)> dyn(
        static_cast<unsigned char *>(std::aligned_alloc(128, (smem + 127) / 128 * 128 + 128)),
        &std::free);
    dyn_smem = dyn.get();
    dyn_smem_size = smem;
    const unsigned base_seed = seed();
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                block_idx = dim3(bx, by, bz);
                std::memset(dyn_smem, 0xA5, smem);
                const unsigned block_seed =
                    base_seed * 2654435761u + ((bz * grid.y + by) * grid.x + bx) * 1024u;
                std::barrier<> bar(n);
                std::vector<Warp> ws(n / 32);
                for (auto &w : ws) w.bar = std::make_unique<std::barrier<>>(32);
                block_barrier = &bar;
                warps = &ws;
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned t = 0; t < n; t++)
                    threads.emplace_back([t, block_seed, &kernel] {
                        thread_idx = dim3(t, 0, 0);
                        cp_rng.seed(block_seed + t + 1);
                        cp_open.clear();
                        cp_groups.clear();
                        kernel();
                        bool pending = !cp_open.empty();
                        for (auto &g : cp_groups) pending = pending || !g.empty();
                        if (pending) die("cp.async: a thread ended with copies it never waited for");
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

/* __shfl_sync / __shfl_xor_sync of a 4-byte value: every lane posts its value, a barrier over
 * the warp, each reads its source lane's, a second barrier before anyone posts again. */
namespace emu {
template <typename T>
inline T warp_read(unsigned mask, T v, unsigned (*source)(unsigned lane, int arg), int arg) {
    static_assert(sizeof(T) == 4, "only 4-byte shuffles are emulated");
    if (mask != 0xffffffffu) die("__shfl_sync: only full-warp masks are emulated");
    Warp &w = (*warps)[thread_idx.x / 32];
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    w.vals[thread_idx.x % 32] = bits;
    w.bar->arrive_and_wait();
    bits = w.vals[source(thread_idx.x % 32, arg) % 32];
    w.bar->arrive_and_wait();
    T out;
    std::memcpy(&out, &bits, 4);
    return out;
}
}  // namespace emu

template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane) {
    return emu::warp_read(mask, v, [](unsigned, int a) { return (unsigned)a; }, src_lane);
}

template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    return emu::warp_read(mask, v, [](unsigned l, int a) { return l ^ (unsigned)a; }, lane_mask);
}

/* cp.async (see the top of this file) and dynamic shared memory, replacing common.cuh's. */
inline void cb_cp_async16(void *dst, const void *src, bool pred) {
    if (reinterpret_cast<std::uintptr_t>(dst) % 16 != 0 ||
        (pred && reinterpret_cast<std::uintptr_t>(src) % 16 != 0))
        emu::die("cp.async: address not 16-byte aligned");
    if (dst < emu::dyn_smem || static_cast<unsigned char *>(dst) + 16 > emu::dyn_smem + emu::dyn_smem_size)
        emu::die("cp.async: destination outside the dynamic shared memory");
    const emu::CpCopy c{dst, src, pred};
    if (emu::cp_rng() & 1u)
        emu::cp_land(c); /* lands at once */
    else
        emu::cp_open.push_back(c); /* lands when its group is waited for */
}

inline void cb_cp_async_commit() {
    emu::cp_groups.push_back(std::move(emu::cp_open));
    emu::cp_open.clear();
}

template <int N>
inline void cb_cp_async_wait() {
    while (emu::cp_groups.size() > static_cast<size_t>(N)) {
        for (const auto &c : emu::cp_groups.front()) emu::cp_land(c);
        emu::cp_groups.erase(emu::cp_groups.begin());
    }
}

inline unsigned cb_dynamic_smem_bytes() { return static_cast<unsigned>(emu::dyn_smem_size); }
#define CB_DYNAMIC_SMEM(name) unsigned char *name = emu::dyn_smem

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline float __int_as_float(int x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
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
