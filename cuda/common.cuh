/* common.cuh: helpers shared by colibri's CUDA kernels (the .cu files in cuda/).
 *
 * The kernels are launched by PyCUDA (colibri/cuda.py), which checks every launch and every
 * driver call on the host and raises with the kernel name and the Python call site. Inside the
 * kernels there is no exception mechanism, so a kernel that meets bad input records the first
 * failure in a small error record in device memory that the host reads after the batch:
 *
 *   int err[4]: err[0] = CB_KERR_* code of the first failure (0 = none),
 *               err[1] = source line, err[2] = CB_FILE_ID of the file (a CB_KFILE_*),
 *               err[3] = a value
 *               (the offending expert id, token, ...).
 *
 * CB_KCHECK(cond, err, code, value) does that and returns from the kernel; the statement
 * text is kept in the host-side table in colibri/cuda.py by (file, line), because device code
 * cannot hand strings back cheaply.
 *
 * The kernels also compile as plain C++20 with g++ against tests/cuda_emu/cuda_emu.h, a small
 * CPU emulation of the CUDA features they use (threads, barriers, ballots, atomics, WMMA), so
 * their indexing is tested under ASan/UBSan on machines without a GPU.
 */
#ifndef COLIBRI_CUDA_COMMON_CUH
#define COLIBRI_CUDA_COMMON_CUH

#include <cuda_fp16.h>

#include "kernel_abi.h" /* cb_act, the CB_KERR_* codes, the CB_KFILE_* file ids */

/* Record the first failure (code, line, file, value) in err[0..3]; later failures are dropped
 * so the first cause is the one reported. */
__device__ __forceinline__ void cb_kernel_fail(int *err, int code, int line, int file,
                                               int value) {
    if (err != nullptr && atomicCAS(err, 0, code) == 0) {
        err[1] = line;
        err[2] = file;
        err[3] = value;
    }
}

#define CB_KCHECK(cond, err, code, value)                              \
    do {                                                              \
        if (!(cond)) {                                                \
            cb_kernel_fail((err), (code), __LINE__, CB_FILE_ID, (value)); \
            return;                                                   \
        }                                                             \
    } while (0)

/* Asynchronous global -> shared copies (the cp.async pipeline of the fp16 GEMM kernels).
 *   cb_cp_async16(dst, src, pred): copy 16 bytes (both addresses 16-byte aligned); when pred is
 *       false nothing is read and dst is zero-filled (src must still be a valid pointer);
 *   cb_cp_async_commit(): close this thread's current group of copies;
 *   cb_cp_async_wait<N>(): wait until at most N of this thread's groups are still in flight.
 * Only the issuing thread's view is covered: a __syncthreads after the wait makes the data
 * visible to the block. sm_80+ issue cp.async.cg (L2 only, no register round trip); older
 * architectures copy synchronously (same results, no overlap).
 * CB_DYNAMIC_SMEM(name) declares the kernel's dynamic shared memory (128-byte aligned) and
 * cb_dynamic_smem_bytes() reads its size as launched, so a kernel can refuse a short launch.
 * The CPU emulation (tests/cuda_emu/cuda_emu.h, which defines CB_CUDA_EMU) brings its own
 * versions: copies land at a random moment between issue and wait. */
#ifndef CB_CUDA_EMU
__device__ __forceinline__ void cb_cp_async16(void *dst, const void *src, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
                 "r"(pred ? 16 : 0)
                 : "memory");
#else
    *reinterpret_cast<uint4 *>(dst) =
        pred ? *reinterpret_cast<const uint4 *>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

__device__ __forceinline__ void cb_cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cb_cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ unsigned cb_dynamic_smem_bytes() {
    unsigned r;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

#define CB_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif

/* Lanes below this one in the warp: a mask for ranking within a __ballot_sync. */
__device__ __forceinline__ unsigned cb_lanemask_lt() {
    return (1u << (threadIdx.x & 31u)) - 1u;
}

/* Activations selectable at run time by the expert kernels (the `act` argument: a cb_act of
 * kernel_abi.h). */
__device__ __forceinline__ float cb_activation(float x, int act) {
    if (act == CB_ACT_GELU_TANH) {
        const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
        return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
    }
    return x / (1.0f + expf(-x));
}

#endif
