from libc.stdint cimport int64_t

from colibri._core._native cimport (
    cb_act, cb_rope_mode, CB_ACT_GELU_TANH, CB_ACT_SILU, CB_ROPE_NEOX, CB_ROPE_NORMAL,
)
from colibri._core.status cimport cb_status


cdef extern from "colibri/ops.h" nogil:
    cb_status cb_rmsnorm(const float *x, const float *weight, int64_t n, float eps,
                         int add_unit_offset, float *out)
    cb_status cb_rmsnorm_rows(const float *x, int64_t x_stride, int64_t n_rows, int64_t n,
                              const float *weight, float eps, int add_unit_offset, float *out,
                              int64_t out_stride)

    ctypedef struct cb_rope_params_t:
        int64_t n_dims
        cb_rope_mode mode
        float freq_base
        float freq_scale
        float ext_factor
        float attn_factor
        float beta_fast
        float beta_slow
        int64_t n_ctx_orig
        const float *freq_factors

    cb_rope_params_t cb_rope_default_params()
    int CB_ROPE_MAX_DIMS
    void cb_rope_yarn_corr_dims(int64_t n_dims, int64_t n_ctx_orig, float freq_base,
                                float beta_fast, float beta_slow, float dims[2])
    cb_status cb_rope_cache(int64_t pos, int64_t head_dim, const cb_rope_params_t *p,
                            float *cos_out, float *sin_out)
    cb_status cb_rope_apply(float *x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                            int64_t n_dims, cb_rope_mode mode, const float *cos_in,
                            const float *sin_in)
    cb_status cb_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                      const cb_rope_params_t *p)
    cb_status cb_rope_batch(float *x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                            int64_t head_dim, const int64_t *positions, const cb_rope_params_t *p)

    cb_status cb_softmax(float *x, int64_t n)

    cb_status cb_silu(const float *x, int64_t n, float *out)
    cb_status cb_gelu_tanh(const float *x, int64_t n, float *out)
    cb_status cb_act_apply(cb_act act, const float *x, int64_t n, float *out)
    cb_status cb_glu(cb_act act, const float *gate, const float *up, int64_t n, float *out)

    cb_status cb_mul(const float *a, const float *b, int64_t n, float *out)
    cb_status cb_add(const float *a, const float *b, int64_t n, float *out)
    cb_status cb_axpy(float a, const float *x, int64_t n, float *y)
    cb_status cb_scale(float *x, int64_t n, float s)
    cb_status cb_softcap(float *x, int64_t n, float cap)

    cb_status cb_dot_f32(const float *a, const float *b, int64_t n, float *out)
    cb_status cb_dot_rows_f32(const float *q, const float *k, int64_t n_rows, int64_t k_stride,
                              int64_t n, float scale, float *out)
