/* Float (non-quantized) operations of the forward pass: RMSNorm, RoPE, softmax, activations
 * (SiLU, GELU-tanh and their gated forms), elementwise arithmetic, and the pieces attention
 * is built from (scaled dot products against rows of K, axpy to accumulate V, softcap).
 *
 * All data are float32, contiguous within a row (rows may be strided where a stride is taken).
 * Every pointer is borrowed: the caller owns the memory and keeps it alive for the call; no
 * function keeps a pointer after it returns, allocates, or uses threads (callers parallelise
 * over rows/heads/tokens). Lengths and strides count floats (not bytes). Unless a function says
 * otherwise, `out` may be the same array as an input (in place), but partial overlap is not
 * allowed.
 *
 * Every function validates its arguments (NULL with n > 0, negative sizes, bad parameters) and
 * returns CB_STATUS_INVALID_ARGUMENT with a detail; n == 0 is a no-op that succeeds.
 *
 * SIMD: an AVX2+FMA path for the row-wide loops (dot, axpy, scale, add, mul, rmsnorm, softmax,
 * activations, softcap), chosen at run time with cb_cpu_level() (AVX-512 machines use it too),
 * and a scalar path (tests cap the level to exercise both). The AVX2 exp/tanh are polynomial
 * approximations with relative error below 4e-7 (exp) and absolute error below 1e-6 (tanh);
 * exp flushes results below FLT_MIN (x < -87.3) to 0. NaN inputs give NaN outputs.
 */
#ifndef COLIBRI_OPS_H
#define COLIBRI_OPS_H

#include <stdint.h>

#include "colibri/status.h"
#include "kernel_abi.h" /* cuda/: cb_act, shared with the CUDA kernels */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- normalisation ---- */

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], with w[i] = weight[i] (+ 1 when
 * add_unit_offset: Gemma stores weights as w - 1), or 1 when weight is NULL.
 * x, out: n floats; weight: n floats or NULL. eps >= 0. The mean is accumulated in float
 * partial sums (AVX2) or double (scalar). */
cb_status cb_rmsnorm(const float *x, const float *weight, int64_t n, float eps,
                     int add_unit_offset, float *out);

/* cb_rmsnorm over n_rows rows of n floats: row r is x + r*x_stride -> out + r*out_stride
 * (strides >= n; the same weight for every row). Per-head q/k norms are rows of head_dim. */
cb_status cb_rmsnorm_rows(const float *x, int64_t x_stride, int64_t n_rows, int64_t n,
                          const float *weight, float eps, int add_unit_offset, float *out,
                          int64_t out_stride);

/* LayerNorm over n_rows rows (as cb_rmsnorm_rows): out = (x - mean) / sqrt(var + eps) * weight
 * + bias, mean and variance over the row in double; weight / bias NULL: 1 / 0 (phimoe). */
cb_status cb_layernorm_rows(const float *x, int64_t x_stride, int64_t n_rows, int64_t n,
                            const float *weight, const float *bias, float eps, float *out,
                            int64_t out_stride);

/* ---- rotary position embedding ---- */

typedef enum cb_rope_mode {
    CB_ROPE_NORMAL = 0, /* adjacent pairs (x[2i], x[2i+1]): llama, mistral, mixtral, deepseek */
    CB_ROPE_NEOX = 2,   /* halves (x[i], x[i + n_dims/2]): gpt-neox, qwen, gemma, olmoe */
} cb_rope_mode;

/* Parameters of RoPE, following ggml_rope_ext. Pair i (0 <= i < n_dims/2) at position p
 * rotates by theta_extrap = p * freq_base^(-2i/n_dims) / freq_factors[i]; with linear scaling
 * theta_interp = freq_scale * theta_extrap. YaRN (ext_factor != 0) mixes the two per pair with
 * a ramp between the correction dims from beta_fast / beta_slow and n_ctx_orig, and scales the
 * magnitude by mscale = attn_factor * (1 + 0.1 ln(1/freq_scale)); without YaRN mscale =
 * attn_factor. cos/sin are computed in double, so large positions do not lose precision. */
typedef struct cb_rope_params {
    int64_t n_dims;      /* rotated dims (even, <= head_dim); the rest pass through. 0: head_dim */
    cb_rope_mode mode;   /* CB_ROPE_NORMAL or CB_ROPE_NEOX */
    float freq_base;     /* rope.freq_base, > 0 (10000 default) */
    float freq_scale;    /* 1 / linear scaling factor, > 0 (1 default) */
    float ext_factor;    /* YaRN extrapolation mix, 0 disables YaRN (default 0) */
    float attn_factor;   /* magnitude scale (default 1) */
    float beta_fast;     /* YaRN (default 32) */
    float beta_slow;     /* YaRN (default 1) */
    int64_t n_ctx_orig;  /* YaRN: original training context (used when ext_factor != 0) */
    const float *freq_factors; /* borrowed, n_dims/2 divisors of theta (rope_freqs), or NULL */
} cb_rope_params_t;

/* Defaults: n_dims 0 (= head_dim), NORMAL, base 10000, scale 1, no YaRN, attn_factor 1,
 * beta_fast 32, beta_slow 1, n_ctx_orig 0, no freq_factors. */
cb_rope_params_t cb_rope_default_params(void);

/* Largest n_dims supported (cos/sin for one position live on the stack). */
#define CB_ROPE_MAX_DIMS 2048

/* YaRN correction dims (as ggml_rope_yarn_corr_dims): dims[0] = max(0, floor(start)),
 * dims[1] = min(n_dims - 1, ceil(end)). */
void cb_rope_yarn_corr_dims(int64_t n_dims, int64_t n_ctx_orig, float freq_base,
                            float beta_fast, float beta_slow, float dims[2]);

/* cos/sin of every rotated pair at position pos, mscale included: cos_out, sin_out each
 * n_dims/2 floats (n_dims resolved against head_dim). Lets a caller compute them once per
 * token for Q and K of every layer that shares the parameters. */
cb_status cb_rope_cache(int64_t pos, int64_t head_dim, const cb_rope_params_t *p,
                        float *cos_out, float *sin_out);

/* cb_rope_cache for n_tokens positions, the pair factors computed once: token t's cos/sin at
 * cos_out + t*stride and sin_out + t*stride (stride >= n_dims/2). */
cb_status cb_rope_cache_batch(int64_t n_tokens, const int64_t *positions, int64_t head_dim,
                              const cb_rope_params_t *p, float *cos_out, float *sin_out,
                              int64_t stride);

/* Rotates n_heads heads of head_dim floats (head h at x + h*head_stride, head_stride >=
 * head_dim) in place with a cache from cb_rope_cache. */
cb_status cb_rope_apply(float *x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                        int64_t n_dims, cb_rope_mode mode, const float *cos_in,
                        const float *sin_in);

/* In place on one token: x holds n_heads contiguous heads of head_dim floats. */
cb_status cb_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                  const cb_rope_params_t *p);

/* In place on n_tokens tokens: token t's heads start at x + t*token_stride (token_stride >=
 * n_heads*head_dim, heads contiguous) and rotate by positions[t] (any int64). */
cb_status cb_rope_batch(float *x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                        int64_t head_dim, const int64_t *positions, const cb_rope_params_t *p);

/* ---- softmax and activations ---- */

/* In place: x = exp(x - max) / sum. Stable for any finite input; -inf entries (masked) get 0.
 * A row that is entirely -inf becomes all zeros (no NaN); a NaN entry makes the row NaN (never
 * a silent all-zero row). */
cb_status cb_softmax(float *x, int64_t n);

/* cb_act (CB_ACT_SILU, CB_ACT_GELU_TANH) is shared with the CUDA kernels: cuda/kernel_abi.h. */

/* out = act(x), n floats. */
cb_status cb_silu(const float *x, int64_t n, float *out);
cb_status cb_gelu_tanh(const float *x, int64_t n, float *out);
cb_status cb_act_apply(cb_act act, const float *x, int64_t n, float *out);

/* Gated unit: out = act(gate) * up (SwiGLU with CB_ACT_SILU, GeGLU with CB_ACT_GELU_TANH).
 * out may alias gate or up. */
cb_status cb_glu(cb_act act, const float *gate, const float *up, int64_t n, float *out);

/* ---- elementwise ---- */

cb_status cb_mul(const float *a, const float *b, int64_t n, float *out); /* out = a * b */
cb_status cb_add(const float *a, const float *b, int64_t n, float *out); /* out = a + b */
cb_status cb_axpy(float a, const float *x, int64_t n, float *y);         /* y += a * x */
cb_status cb_scale(float *x, int64_t n, float s);                        /* x *= s */
/* x = cap * tanh(x / cap), in place; cap > 0 (Gemma 2 logit / attention softcapping). */
cb_status cb_softcap(float *x, int64_t n, float cap);

/* ---- dot products ---- */

/* *out = sum a[i] b[i] (float accumulators; AVX2 uses 32 partial sums). */
cb_status cb_dot_f32(const float *a, const float *b, int64_t n, float *out);

/* Attention scores: out[j] = scale * dot(q, k + j*k_stride) for j < n_rows, each of n floats
 * (k_stride >= n). out must not overlap q or k. */
cb_status cb_dot_rows_f32(const float *q, const float *k, int64_t n_rows, int64_t k_stride,
                          int64_t n, float scale, float *out);

/* Attention of n_q query heads sharing one K/V head: out[h*o_stride + j] = scale * dot(q +
 * h*q_stride, k + j*k_stride) for h < n_q, j < n_rows; each K row is read once for all heads and
 * each dot is the one of cb_dot_rows_f32 (the same sums). out must not overlap q or k. */
cb_status cb_dot_rows_multi_f32(const float *q, int64_t q_stride, int n_q, const float *k,
                                int64_t n_rows, int64_t k_stride, int64_t n, float scale,
                                float *out, int64_t o_stride);

/* The probability-weighted V sum of n_q heads: y[h*y_stride + i] += p[h*p_stride + j] *
 * v[j*v_stride + i] for h < n_q, j < n_rows (in j order, each step as cb_axpy), i < n; each V
 * row is read once for all heads. y must not overlap p or v. */
cb_status cb_axpy_rows_multi_f32(const float *p, int64_t p_stride, int n_q, const float *v,
                                 int64_t n_rows, int64_t v_stride, int64_t n, float *y,
                                 int64_t y_stride);

/* The same two for an f16 K/V cache: K and V rows of f16 values (strides in elements), q and p
 * floats; the results are those of the _f32 functions on the rows widened to floats, bit for
 * bit. n is at most 4096. */
cb_status cb_dot_rows_multi_f16(const float *q, int64_t q_stride, int n_q, const uint16_t *k,
                                int64_t n_rows, int64_t k_stride, int64_t n, float scale,
                                float *out, int64_t o_stride);
cb_status cb_axpy_rows_multi_f16(const float *p, int64_t p_stride, int n_q, const uint16_t *v,
                                 int64_t n_rows, int64_t v_stride, int64_t n, float *y,
                                 int64_t y_stride);

/* out[i] = cb_f32_to_f16(x[i]) and x[i] = cb_f16_to_f32(cb_f32_to_f16(x[i])) for i < n (F16C
 * where the CPU has AVX2: the same bits, round to nearest even; a NaN stays a NaN). The f16 KV
 * cache's stores and its rounding of queries and probabilities. */
void cb_f32_to_f16_n(const float *x, int64_t n, uint16_t *out);
void cb_f16_round(float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
