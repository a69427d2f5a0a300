/* kernel_abi.h: the values the CUDA kernels share with the C core and with Python, written once.
 *
 * Plain C (no CUDA), so that it compiles as C (include/colibri/ops.h includes it for cb_act),
 * as C++ for nvcc and the CPU emulation (cuda/common.cuh includes it), and reaches Python
 * through Cython (`cpdef enum`s of colibri/_core/_native.pxd: colibri._core._ops.cb_act,
 * colibri._core._forward.cb_kerr and cb_kfile), so no value is retyped anywhere.
 */
#ifndef COLIBRI_CUDA_KERNEL_ABI_H
#define COLIBRI_CUDA_KERNEL_ABI_H

/* FFN activation: the forward pass's (cb_model_desc_t.act) and the expert kernels' `act`. */
typedef enum cb_act {
    CB_ACT_SILU = 0,      /* x * sigmoid(x) */
    CB_ACT_GELU_TANH = 1, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): gelu_pytorch_tanh */
    /* gpt-oss's gated unit (a GLU only): g = min(gate, 7), u = clamp(up, -7, 7),
     * g * sigmoid(1.702 g) * (u + 1); CPU only (the expert kernels refuse it) */
    CB_ACT_SWIGLU_OAI = 2,
} cb_act;

/* err[0] of a kernel's error record (common.cuh): the first failure's code. */
typedef enum cb_kerr {
    CB_KERR_NONE = 0,
    CB_KERR_ROUTE_ARG = 1,       /* routing arguments out of range (routing_logic.h EARG) */
    CB_KERR_ROUTE_NONFINITE = 2, /* a router logit or bias was NaN or infinite */
    CB_KERR_CAPACITY = 3,        /* the padded token list does not fit the buffers given */
    CB_KERR_NOT_RESIDENT = 4,    /* a routed expert has no slot in the expert pool */
    CB_KERR_SHAPE = 5,           /* a GEMM dimension is not a multiple of what it needs */
    CB_KERR_SMEM = 6,            /* launched with less dynamic shared memory than it needs */
} cb_kerr;

/* err[2] of the error record: the kernel source file (each .cu defines CB_FILE_ID as one). */
typedef enum cb_kfile {
    CB_KFILE_ROUTING = 1,  /* routing.cu */
    CB_KFILE_MOE_GEMM = 2, /* moe_gemm.cu */
} cb_kfile;

#endif
