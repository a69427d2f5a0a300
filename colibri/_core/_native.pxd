# The C enums that Python reads. Declared `cpdef`, each is also a Python IntEnum of
# colibri._core._native whose values Cython takes from the header at build time (so no value is
# retyped in Python); the header .pxd files cimport the C types from here.

cdef extern from "colibri/status.h":
    cpdef enum cb_status:
        CB_OK
        CB_STATUS_INVALID_ARGUMENT
        CB_STATUS_OUT_OF_MEMORY
        CB_STATUS_IO
        CB_STATUS_NOT_FOUND
        CB_STATUS_CORRUPT
        CB_STATUS_UNSUPPORTED
        CB_STATUS_CLOSED
        CB_STATUS_INTERNAL
        CB_STATUS_NOT_FINITE

cdef extern from "colibri/quant.h":
    cpdef enum cb_type:
        CB_TYPE_F32
        CB_TYPE_F16
        CB_TYPE_Q4_0
        CB_TYPE_Q4_1
        CB_TYPE_Q5_0
        CB_TYPE_Q5_1
        CB_TYPE_Q8_0
        CB_TYPE_Q8_1
        CB_TYPE_Q2_K
        CB_TYPE_Q3_K
        CB_TYPE_Q4_K
        CB_TYPE_Q5_K
        CB_TYPE_Q6_K
        CB_TYPE_Q8_K
        CB_TYPE_IQ2_XXS
        CB_TYPE_IQ2_XS
        CB_TYPE_IQ3_XXS
        CB_TYPE_IQ1_S
        CB_TYPE_IQ4_NL
        CB_TYPE_IQ3_S
        CB_TYPE_IQ2_S
        CB_TYPE_IQ4_XS
        CB_TYPE_IQ1_M
        CB_TYPE_BF16
        CB_TYPE_TQ1_0
        CB_TYPE_TQ2_0
        CB_TYPE_MXFP4
        CB_TYPE_I4_G128
        CB_TYPE_Q8_0_R16
        CB_TYPE_Q5_0_R16
        CB_TYPE_Q6_K_R16
        CB_TYPE_Q4_K_R16

cdef extern from "colibri/ops.h":
    cpdef enum cb_rope_mode:
        CB_ROPE_NORMAL
        CB_ROPE_NEOX
    cpdef enum cb_act:
        CB_ACT_SILU
        CB_ACT_GELU_TANH
        CB_ACT_SWIGLU_OAI

cdef extern from "kernel_abi.h":  # cuda/: shared by the C core and the CUDA kernels
    cpdef enum cb_kerr:
        CB_KERR_NONE
        CB_KERR_ROUTE_ARG
        CB_KERR_ROUTE_NONFINITE
        CB_KERR_CAPACITY
        CB_KERR_NOT_RESIDENT
        CB_KERR_SHAPE
        CB_KERR_SMEM
    cpdef enum cb_kfile:
        CB_KFILE_ROUTING
        CB_KFILE_MOE_GEMM

cdef extern from "colibri/forward.h":
    cpdef enum cb_qk_norm:
        CB_QK_NORM_NONE
        CB_QK_NORM_HEAD
        CB_QK_NORM_FULL
        CB_QK_NORM_HEAD_POST

cdef extern from "colibri/experts.h":
    cpdef enum cb_experts_mode:
        CB_EXPERTS_MAPPED
        CB_EXPERTS_CACHE
        CB_EXPERTS_MMAP
    cpdef enum cb_experts_policy:
        CB_EXPERTS_LRU
        CB_EXPERTS_LFRU
