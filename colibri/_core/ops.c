/* Float ops of the forward pass (include/colibri/ops.h): RMSNorm, RoPE, softmax, activations,
 * elementwise arithmetic, dot products for attention.
 *
 * Each row-wide op has a scalar implementation (portable C, the reference the tests cap to)
 * and, on x86-64, an AVX2+FMA one compiled with a target attribute so that a portable build
 * still has it; dispatch reads cb_cpu_level() on every call (a load and a compare, negligible
 * next to a row). RoPE is scalar: its cost is n_dims/2 sin/cos per token (computed in double
 * for precision at large positions) plus a few flops per element.
 *
 * Invariants: no allocation, no threads, no global state; all pointers borrowed for the call.
 * Inputs are validated (NULL, negative sizes, strides, rope parameters) before any access.
 */
#include "colibri/ops.h"

#include <float.h>
#include <math.h>
#include <stddef.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "quant_impl.h" /* the AVX-512 score kernel's declaration (ops_avx512.c) */

#if defined(__x86_64__) && defined(__GNUC__)
#define CB_OPS_X86 1
#include <immintrin.h>
#define AVX2_FN __attribute__((target("avx2,fma")))
#else
#define CB_OPS_X86 0
#endif

static inline int use_avx2(void) {
#if CB_OPS_X86
    return cb_cpu_level() >= CB_SIMD_AVX2;
#else
    return 0;
#endif
}

static inline int use_avx512(void) {
#if CB_OPS_X86
    return cb_cpu_level() >= CB_SIMD_AVX512;
#else
    return 0;
#endif
}

#define CHECK_N(n, name)                                                               \
    do {                                                                               \
        if ((n) < 0) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: n = %lld < 0", name, \
                                    (long long)(n));                                   \
    } while (0)
#define CHECK_PTR(p, n, name, what)                                                      \
    do {                                                                                 \
        if ((n) > 0 && !(p))                                                             \
            return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", name, what);    \
    } while (0)

/* ------------------------------------------------------------------------------------- */
/* scalar kernels                                                                        */

static float dot_scalar(const float *a, const float *b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

static double sumsq_scalar(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

static void rmsnorm_apply_scalar(const float *x, const float *w, int unit, float scale,
                                 int64_t n, float *out) {
    if (!w) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale;
    } else if (unit) {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * (1.0f + w[i]);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
    }
}

static float gelu_tanh_1(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static float silu_1(float x) { return x / (1.0f + expf(-x)); }

static float act_1(cb_act act, float x) {
    return act == CB_ACT_SILU ? silu_1(x) : gelu_tanh_1(x);
}

/* A softmax row without a finite maximum: entirely masked (-inf) is all zeros; any NaN (which
 * the max skips) makes it all NaN, so that corrupt scores are not silently read as "masked". */
static void masked_row(float *x, int64_t n) {
    int nan = 0;
    for (int64_t i = 0; i < n; i++) nan |= isnan(x[i]);
    for (int64_t i = 0; i < n; i++) x[i] = nan ? NAN : 0.0f;
}

/* ------------------------------------------------------------------------------------- */
/* AVX2 kernels                                                                          */

#if CB_OPS_X86
AVX2_FN static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

AVX2_FN static inline float hmax8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_max_ps(lo, hi);
    lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* exp(x): Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r,
 * scale by 2^k built in the exponent bits as 2^(k/2) * 2^(k - k/2), so that k = 128 and
 * k = -126 stay exact (one factor alone would leave the normal range).
 * x > 88.72 -> inf, x < -87.33 -> 0, NaN -> NaN (min/max keep a NaN second operand). */
AVX2_FN static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.7228f), lo = _mm256_set1_ps(-87.3365f);
    __m256 xc = _mm256_max_ps(lo, _mm256_min_ps(hi, x));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ki = _mm256_cvtps_epi32(k);
    __m256i k1 = _mm256_srai_epi32(ki, 1), k2 = _mm256_sub_epi32(ki, k1);
    __m256i e1 = _mm256_slli_epi32(_mm256_add_epi32(k1, _mm256_set1_epi32(127)), 23);
    __m256i e2 = _mm256_slli_epi32(_mm256_add_epi32(k2, _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e1)), _mm256_castsi256_ps(e2));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    return y;
}

/* tanh(u): odd polynomial for |u| < 0.625 (no cancellation near 0), else
 * sign(u) (1 - 2 / (exp(2|u|) + 1)). */
AVX2_FN static inline __m256 tanh8(__m256 u) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, u);
    __m256 s = _mm256_mul_ps(u, u);
    __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, s, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, s), u, u);
    __m256 e = exp8(_mm256_add_ps(a, a));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                               _mm256_div_ps(_mm256_set1_ps(2.0f),
                                             _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(u, sign));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
}

AVX2_FN static inline __m256 silu8(__m256 x) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

AVX2_FN static inline __m256 gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f),
                             _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    __m256 t = tanh8(u);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                         _mm256_add_ps(_mm256_set1_ps(1.0f), t));
}

/* Loads the n < 8 tail of p into a vector padded with `pad`. */
AVX2_FN static inline __m256 load_tail(const float *p, int64_t n, float pad) {
    float buf[8];
    for (int i = 0; i < 8; i++) buf[i] = i < n ? p[i] : pad;
    return _mm256_loadu_ps(buf);
}

AVX2_FN static inline void store_tail(float *p, int64_t n, __m256 v) {
    float buf[8];
    _mm256_storeu_ps(buf, v);
    for (int i = 0; i < n; i++) p[i] = buf[i];
}

AVX2_FN static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) s1 = _mm256_fmadd_ps(load_tail(a + i, n - i, 0), load_tail(b + i, n - i, 0), s1);
    return hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

AVX2_FN static float sumsq_avx2(const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    if (i < n) {
        __m256 a = load_tail(x + i, n - i, 0);
        s1 = _mm256_fmadd_ps(a, a, s1);
    }
    return hsum8(_mm256_add_ps(s0, s1));
}

AVX2_FN static void rmsnorm_apply_avx2(const float *x, const float *w, int unit, float scale,
                                       int64_t n, float *out) {
    __m256 vs = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
        if (w) {
            __m256 wv = _mm256_loadu_ps(w + i);
            if (unit) wv = _mm256_add_ps(wv, one);
            v = _mm256_mul_ps(v, wv);
        }
        _mm256_storeu_ps(out + i, v);
    }
    rmsnorm_apply_scalar(x + i, w ? w + i : NULL, unit, scale, n - i, out + i);
}

AVX2_FN static void softmax_avx2(float *x, int64_t n) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    float m = hmax8(vm);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    if (m == -INFINITY) {
        masked_row(x, n);
        return;
    }
    __m256 mv = _mm256_set1_ps(m), sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(x + i, e);
    }
    if (i < n) {
        __m256 e = exp8(_mm256_sub_ps(load_tail(x + i, n - i, -INFINITY), mv));
        sum = _mm256_add_ps(sum, e);
        store_tail(x + i, n - i, e);
    }
    __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= _mm256_cvtss_f32(inv);
}

AVX2_FN static void act_avx2(cb_act act, const float *x, const float *up, int64_t n, float *out) {
    int64_t i = 0;
    for (; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256 v = m == 8 ? _mm256_loadu_ps(x + i) : load_tail(x + i, m, 0);
        __m256 y = act == CB_ACT_SILU ? silu8(v) : gelu8(v);
        if (up) y = _mm256_mul_ps(y, m == 8 ? _mm256_loadu_ps(up + i) : load_tail(up + i, m, 0));
        if (m == 8)
            _mm256_storeu_ps(out + i, y);
        else
            store_tail(out + i, m, y);
    }
}

AVX2_FN static void softcap_avx2(float *x, int64_t n, float cap) {
    __m256 c = _mm256_set1_ps(cap), ic = _mm256_set1_ps(1.0f / cap);
    for (int64_t i = 0; i < n; i += 8) {
        int64_t m = n - i < 8 ? n - i : 8;
        __m256 v = m == 8 ? _mm256_loadu_ps(x + i) : load_tail(x + i, m, 0);
        __m256 y = _mm256_mul_ps(c, tanh8(_mm256_mul_ps(v, ic)));
        if (m == 8)
            _mm256_storeu_ps(x + i, y);
        else
            store_tail(x + i, m, y);
    }
}

AVX2_FN static void binop_avx2(int op, const float *a, const float *b, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 va = _mm256_loadu_ps(a + i), vb = _mm256_loadu_ps(b + i);
        _mm256_storeu_ps(out + i, op ? _mm256_add_ps(va, vb) : _mm256_mul_ps(va, vb));
    }
    for (; i < n; i++) out[i] = op ? a[i] + b[i] : a[i] * b[i];
}

AVX2_FN static void axpy_avx2(float a, const float *x, int64_t n, float *y) {
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* Attention's score rows: out[h * os + j] = scale * dot(q_h, k_j) for 8 rows j at once (n a
 * multiple of 32), bit-identical to scale * dot_avx2(q_h, k_j, n): per row the same four
 * accumulators and (s0 + s1) + (s2 + s3), then hsum8's tree (w_i = v_i + v_i+4, (w0 + w2) +
 * (w1 + w3)) computed for the 8 rows together by shuffles instead of one reduction per row. */
AVX2_FN static inline void reduce_rows8_avx2(const __m256 *t, float scale, float *out);
AVX2_FN static void dot_rows8_avx2(const float *q, const float *k, int64_t k_stride, int64_t n,
                                   float scale, float *out) {
    __m256 t[8];
    for (int r = 0; r < 8; r += 2) { /* two rows a pass: one load of q for both */
        const float *b = k + r * k_stride, *c = b + k_stride;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, u0 = s0, u1 = s0, u2 = s0, u3 = s0;
        for (int64_t i = 0; i < n; i += 32) {
            const __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
            const __m256 q2 = _mm256_loadu_ps(q + i + 16), q3 = _mm256_loadu_ps(q + i + 24);
            s0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(b + i), s0);
            s1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(b + i + 8), s1);
            s2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(b + i + 16), s2);
            s3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(b + i + 24), s3);
            u0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(c + i), u0);
            u1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(c + i + 8), u1);
            u2 = _mm256_fmadd_ps(q2, _mm256_loadu_ps(c + i + 16), u2);
            u3 = _mm256_fmadd_ps(q3, _mm256_loadu_ps(c + i + 24), u3);
        }
        t[r] = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
        t[r + 1] = _mm256_add_ps(_mm256_add_ps(u0, u1), _mm256_add_ps(u2, u3));
    }
    reduce_rows8_avx2(t, scale, out);
}

/* out[r] = scale * (hsum8's tree of t[r]) for 8 rows (dot_rows8_avx2's and the AVX-512 kernel's
 * partial sums, ops_avx512.c) */
AVX2_FN static inline void reduce_rows8_avx2(const __m256 *t, float scale, float *out) {
    __m256 w[4]; /* w[p]: [w of row 2p | w of row 2p + 1] */
    for (int p = 0; p < 4; p++)
        w[p] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x31));
    /* u: per lane [u0, u1] of two rows; lane 0 rows (0, 2) / (4, 6), lane 1 rows (1, 3) / (5, 7) */
    __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 u1 = _mm256_add_ps(_mm256_shuffle_ps(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm256_shuffle_ps(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1)));
    /* lanes hold rows 0 2 4 6 | 1 3 5 7 */
    r = _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(scale), r));
}

/* 8 rows' scores for n_q heads by the AVX-512 kernel, f32 or f16 rows (n a multiple of 32) */
AVX2_FN static void scores8_avx512(const float *q, int64_t q_stride, int n_q, const void *k,
                                   int f16, int64_t k_stride, int64_t n, float scale, float *out,
                                   int64_t o_stride) {
    for (int h0 = 0; h0 < n_q; h0 += 8) {
        float t[8 * 64]; /* 8 heads x 8 rows x 8 lanes */
        const int hn = n_q - h0 < 8 ? n_q - h0 : 8;
        if (f16) cb_avx512_dot_rows8_t_f16(q + h0 * q_stride, q_stride, hn, k, k_stride, n, t);
        else cb_avx512_dot_rows8_t(q + h0 * q_stride, q_stride, hn, k, k_stride, n, t);
        for (int h = 0; h < hn; h++) {
            __m256 v[8];
            for (int r = 0; r < 8; r++) v[r] = _mm256_loadu_ps(t + h * 64 + 8 * r);
            reduce_rows8_avx2(v, scale, out + (h0 + h) * o_stride);
        }
    }
}

/* Prefetch rows [j, j + 8) of n floats at stride `stride` into L2. The KV cache keeps a token's
 * rows of every layer together, so one head's rows are a token stride apart (16 KiB on the MoE
 * bench model): a stride the hardware prefetchers do not follow, and whose rows share the same
 * cache sets (8 fit in an 8-way L1). */
AVX2_FN static inline void prefetch_rows8(const float *v, int64_t j, int64_t n_rows, int64_t stride,
                                          int64_t n) {
    for (int64_t r = j; r < j + 8 && r < n_rows; r++)
        for (int64_t o = 0; o < n; o += 16) __builtin_prefetch(v + r * stride + o, 0, 1);
}

/* Attention's value sum y_h += p_h[j] * v_j over rows j for n_q heads: rows 8 at a time (they stay
 * in L1 while every head reads them, where a head-by-head pass over all rows read each row once
 * per head, from DRAM at long contexts), y 64 values at a time in registers; per value the same
 * fmas in the same row order as axpy_avx2 row by row (n a multiple of 8). */
AVX2_FN static void axpy_rows_avx2(const float *p, int64_t p_stride, int n_q, const float *v,
                                   int64_t n_rows, int64_t v_stride, int64_t n, float *y,
                                   int64_t y_stride) {
    for (int64_t j0 = 0; j0 < n_rows; j0 += 8) {
        const int64_t j1 = j0 + 8 < n_rows ? j0 + 8 : n_rows;
        prefetch_rows8(v, j0 + 16, n_rows, v_stride, n);
        for (int h = 0; h < n_q; h++) {
            const float *ph = p + h * p_stride;
            float *yh = y + h * y_stride;
            int64_t i = 0;
            for (; i + 64 <= n; i += 64) {
                __m256 a[8];
                for (int c = 0; c < 8; c++) a[c] = _mm256_loadu_ps(yh + i + 8 * c);
                for (int64_t j = j0; j < j1; j++) {
                    const __m256 pj = _mm256_set1_ps(ph[j]);
                    const float *x = v + j * v_stride + i;
                    for (int c = 0; c < 8; c++) a[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(x + 8 * c), a[c]);
                }
                for (int c = 0; c < 8; c++) _mm256_storeu_ps(yh + i + 8 * c, a[c]);
            }
            for (; i < n; i += 8) {
                __m256 a = _mm256_loadu_ps(yh + i);
                for (int64_t j = j0; j < j1; j++)
                    a = _mm256_fmadd_ps(_mm256_set1_ps(ph[j]), _mm256_loadu_ps(v + j * v_stride + i), a);
                _mm256_storeu_ps(yh + i, a);
            }
        }
    }
}

AVX2_FN static void scale_avx2(float *x, int64_t n, float s) {
    __m256 vs = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < n; i++) x[i] *= s;
}
/* n f16 values -> floats (F16C: every AVX2 CPU has it) */
__attribute__((target("avx2,fma,f16c"))) static void widen_f16_avx2(const uint16_t *src, int64_t n,
                                                                    float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}
/* n floats -> f16 (round to nearest even, as cb_f32_to_f16), and floats rounded through f16 */
__attribute__((target("avx2,fma,f16c"))) static int64_t narrow_f16_avx2(const float *src, int64_t n,
                                                                       uint16_t *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    return i;
}
__attribute__((target("avx2,fma,f16c"))) static int64_t round_f16_avx2(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    return i;
}
#endif /* CB_OPS_X86 */

/* ------------------------------------------------------------------------------------- */
/* public: normalisation                                                                 */

static void rmsnorm_row(const float *x, const float *w, int64_t n, float eps, int unit,
                        float *out) {
    double ss;
#if CB_OPS_X86
    if (use_avx2()) {
        ss = sumsq_avx2(x, n);
        float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        rmsnorm_apply_avx2(x, w, unit, scale, n, out);
        return;
    }
#endif
    ss = sumsq_scalar(x, n);
    float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    rmsnorm_apply_scalar(x, w, unit, scale, n, out);
}

cb_status cb_rmsnorm(const float *x, const float *weight, int64_t n, float eps,
                     int add_unit_offset, float *out) {
    return cb_rmsnorm_rows(x, n, 1, n, weight, eps, add_unit_offset, out, n);
}

/* The argument checks of the row norms (name: the caller's, for the message). */
static cb_status norm_rows_args(const char *name, const float *x, int64_t x_stride,
                                int64_t n_rows, int64_t n, float eps, const float *out,
                                int64_t out_stride) {
    CHECK_N(n, name);
    if (n_rows < 0) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: n_rows %lld < 0", name,
                                   (long long)n_rows);
    if (n == 0 || n_rows == 0) return CB_OK;
    if (!x || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: x or out is NULL", name);
    if ((n_rows > 1 && (x_stride < n || out_stride < n)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "%s: strides %lld, %lld smaller than the row length %lld", name,
                       (long long)x_stride, (long long)out_stride, (long long)n);
    if (!(eps >= 0.0f) || isinf(eps))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: eps %g must be finite and >= 0", name,
                       (double)eps);
    return CB_OK;
}

cb_status cb_rmsnorm_rows(const float *x, int64_t x_stride, int64_t n_rows, int64_t n,
                          const float *weight, float eps, int add_unit_offset, float *out,
                          int64_t out_stride) {
    cb_status st = norm_rows_args("cb_rmsnorm", x, x_stride, n_rows, n, eps, out, out_stride);
    if (st != CB_OK || n == 0 || n_rows == 0) return st;
    for (int64_t r = 0; r < n_rows; r++)
        rmsnorm_row(x + r * x_stride, weight, n, eps, add_unit_offset != 0, out + r * out_stride);
    return CB_OK;
}

cb_status cb_layernorm_rows(const float *x, int64_t x_stride, int64_t n_rows, int64_t n,
                            const float *weight, const float *bias, float eps, float *out,
                            int64_t out_stride) {
    cb_status st = norm_rows_args("cb_layernorm", x, x_stride, n_rows, n, eps, out, out_stride);
    if (st != CB_OK || n == 0 || n_rows == 0) return st;
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * x_stride;
        float *o = out + r * out_stride;
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; i++) mean += xr[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
        const double inv = 1.0 / sqrt(var / (double)n + (double)eps);
        for (int64_t i = 0; i < n; i++) {
            float v = (float)(((double)xr[i] - mean) * inv);
            if (weight) v *= weight[i];
            o[i] = bias ? v + bias[i] : v;
        }
    }
    return CB_OK;
}

/* ------------------------------------------------------------------------------------- */
/* public: RoPE                                                                          */

cb_rope_params_t cb_rope_default_params(void) {
    cb_rope_params_t p = {0};
    p.n_dims = 0;
    p.mode = CB_ROPE_NORMAL;
    p.freq_base = 10000.0f;
    p.freq_scale = 1.0f;
    p.ext_factor = 0.0f;
    p.attn_factor = 1.0f;
    p.beta_fast = 32.0f;
    p.beta_slow = 1.0f;
    p.n_ctx_orig = 0;
    p.freq_factors = NULL;
    return p;
}

static double yarn_corr_dim(double n_dims, double n_ctx_orig, double n_rot, double base) {
    /* the dimension whose wavelength makes n_rot turns over the original context */
    return n_dims * log(n_ctx_orig / (n_rot * 2.0 * 3.14159265358979323846)) / (2.0 * log(base));
}

void cb_rope_yarn_corr_dims(int64_t n_dims, int64_t n_ctx_orig, float freq_base,
                            float beta_fast, float beta_slow, float dims[2]) {
    double start = floor(yarn_corr_dim((double)n_dims, (double)n_ctx_orig, beta_fast, freq_base));
    double end = ceil(yarn_corr_dim((double)n_dims, (double)n_ctx_orig, beta_slow, freq_base));
    dims[0] = (float)(start > 0 ? start : 0);
    dims[1] = (float)(end < (double)(n_dims - 1) ? end : (double)(n_dims - 1));
}

static cb_status rope_resolve(const cb_rope_params_t *p, int64_t head_dim, int64_t *n_dims) {
    if (!p) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: params is NULL");
    if (head_dim <= 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: head_dim %lld <= 0",
                       (long long)head_dim);
    int64_t nd = p->n_dims ? p->n_dims : head_dim;
    if (nd <= 0 || nd % 2 || nd > head_dim || nd > CB_ROPE_MAX_DIMS)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_rope: n_dims %lld must be even, > 0 and <= head_dim %lld (max %d)",
                       (long long)nd, (long long)head_dim, CB_ROPE_MAX_DIMS);
    if (p->mode != CB_ROPE_NORMAL && p->mode != CB_ROPE_NEOX)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: unknown mode %d", (int)p->mode);
    if (!(p->freq_base > 0.0f) || isinf(p->freq_base) || p->freq_base == 1.0f)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: freq_base %g must be > 0, != 1",
                       (double)p->freq_base);
    if (!(p->freq_scale > 0.0f) || isinf(p->freq_scale))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: freq_scale %g must be > 0",
                       (double)p->freq_scale);
    if (!isfinite(p->ext_factor) || !isfinite(p->attn_factor))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: ext_factor %g / attn_factor %g",
                       (double)p->ext_factor, (double)p->attn_factor);
    if (p->ext_factor != 0.0f &&
        (p->n_ctx_orig <= 0 || !(p->beta_fast > 0.0f) || !(p->beta_slow > 0.0f) ||
         isinf(p->beta_fast) || isinf(p->beta_slow)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_rope: YaRN needs n_ctx_orig > 0 (got %lld) and beta_fast, "
                       "beta_slow > 0 (got %g, %g)",
                       (long long)p->n_ctx_orig, (double)p->beta_fast, (double)p->beta_slow);
    *n_dims = nd;
    return CB_OK;
}

/* Every rotation angle is linear in the position: theta_i(p) = p * a_i. With YaRN,
 * theta = interp (1 - mix) + extrap mix = extrap (freq_scale (1 - mix) + mix). So the per-pair
 * factors a_i (and mscale) are computed once per call, and each token costs n_dims/2 sincos. */
static double rope_factors(int64_t nd, const cb_rope_params_t *p, double *a) {
    double base = p->freq_base, fscale = p->freq_scale, mscale = p->attn_factor;
    float corr[2] = {0, 0};
    if (p->ext_factor != 0.0f) {
        cb_rope_yarn_corr_dims(nd, p->n_ctx_orig, p->freq_base, p->beta_fast, p->beta_slow, corr);
        mscale *= 1.0 + 0.1 * log(1.0 / fscale);
    }
    for (int64_t i = 0; i < nd / 2; i++) {
        double f = pow(base, -2.0 * (double)i / (double)nd);
        if (p->freq_factors) f /= p->freq_factors[i];
        double k = fscale;
        if (p->ext_factor != 0.0f) {
            double y = ((double)i - corr[0]) / fmax(0.001, (double)corr[1] - corr[0]);
            double mix = (1.0 - fmin(1.0, fmax(0.0, y))) * p->ext_factor;
            k = fscale * (1.0 - mix) + mix;
        }
        a[i] = f * k;
    }
    return mscale;
}

static void rope_cache_impl(int64_t pos, int64_t nd, const double *a, double mscale, float *cs,
                            float *sn) {
    for (int64_t i = 0; i < nd / 2; i++) {
        double theta = (double)pos * a[i];
        cs[i] = (float)(cos(theta) * mscale);
        sn[i] = (float)(sin(theta) * mscale);
    }
}

cb_status cb_rope_cache(int64_t pos, int64_t head_dim, const cb_rope_params_t *p,
                        float *cos_out, float *sin_out) {
    int64_t nd = 0;
    cb_status s = rope_resolve(p, head_dim, &nd);
    if (s != CB_OK) return s;
    if (!cos_out || !sin_out)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope_cache: cos_out or sin_out is NULL");
    double a[CB_ROPE_MAX_DIMS / 2];
    double mscale = rope_factors(nd, p, a);
    rope_cache_impl(pos, nd, a, mscale, cos_out, sin_out);
    return CB_OK;
}

cb_status cb_rope_cache_batch(int64_t n_tokens, const int64_t *positions, int64_t head_dim,
                              const cb_rope_params_t *p, float *cos_out, float *sin_out,
                              int64_t stride) {
    int64_t nd = 0;
    cb_status s = rope_resolve(p, head_dim, &nd);
    if (s != CB_OK) return s;
    if (n_tokens < 0 || stride < nd / 2)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope_cache_batch: n_tokens %lld, stride "
                       "%lld < n_dims/2 %lld", (long long)n_tokens, (long long)stride,
                       (long long)(nd / 2));
    if (n_tokens > 0 && (!positions || !cos_out || !sin_out))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope_cache_batch: NULL pointer");
    double a[CB_ROPE_MAX_DIMS / 2];
    double mscale = rope_factors(nd, p, a);
    for (int64_t t = 0; t < n_tokens; t++)
        rope_cache_impl(positions[t], nd, a, mscale, cos_out + t * stride, sin_out + t * stride);
    return CB_OK;
}

static void rope_apply_impl(float *x, int64_t n_heads, int64_t head_stride, int64_t nd,
                            cb_rope_mode mode, const float *cs, const float *sn) {
    int64_t half = nd / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_stride;
        if (mode == CB_ROPE_NEOX) {
            for (int64_t i = 0; i < half; i++) {
                float x0 = v[i], x1 = v[i + half];
                v[i] = x0 * cs[i] - x1 * sn[i];
                v[i + half] = x0 * sn[i] + x1 * cs[i];
            }
        } else {
            for (int64_t i = 0; i < half; i++) {
                float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * cs[i] - x1 * sn[i];
                v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
            }
        }
    }
}

cb_status cb_rope_apply(float *x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                        int64_t n_dims, cb_rope_mode mode, const float *cos_in,
                        const float *sin_in) {
    if (n_heads < 0 || head_dim <= 0 || (n_heads > 1 && head_stride < head_dim))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_rope_apply: n_heads %lld, head_dim %lld, head_stride %lld",
                       (long long)n_heads, (long long)head_dim, (long long)head_stride);
    if (n_dims <= 0 || n_dims % 2 || n_dims > head_dim)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_rope_apply: n_dims %lld must be even, > 0 and <= head_dim %lld",
                       (long long)n_dims, (long long)head_dim);
    if (mode != CB_ROPE_NORMAL && mode != CB_ROPE_NEOX)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope_apply: unknown mode %d", (int)mode);
    if (n_heads == 0) return CB_OK;
    if (!x || !cos_in || !sin_in)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope_apply: NULL pointer");
    rope_apply_impl(x, n_heads, head_stride, n_dims, mode, cos_in, sin_in);
    return CB_OK;
}

cb_status cb_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t pos,
                  const cb_rope_params_t *p) {
    return cb_rope_batch(x, 1, n_heads * head_dim, n_heads, head_dim, &pos, p);
}

cb_status cb_rope_batch(float *x, int64_t n_tokens, int64_t token_stride, int64_t n_heads,
                        int64_t head_dim, const int64_t *positions, const cb_rope_params_t *p) {
    int64_t nd = 0;
    cb_status s = rope_resolve(p, head_dim, &nd);
    if (s != CB_OK) return s;
    if (n_tokens < 0 || n_heads < 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: n_tokens %lld, n_heads %lld < 0",
                       (long long)n_tokens, (long long)n_heads);
    if (n_tokens == 0 || n_heads == 0) return CB_OK;
    if (n_tokens > 1 && token_stride < n_heads * head_dim)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_rope: token_stride %lld < n_heads * head_dim = %lld",
                       (long long)token_stride, (long long)(n_heads * head_dim));
    if (!x || !positions) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_rope: NULL pointer");
    float cs[CB_ROPE_MAX_DIMS / 2], sn[CB_ROPE_MAX_DIMS / 2];
    double a[CB_ROPE_MAX_DIMS / 2];
    double mscale = rope_factors(nd, p, a);
    for (int64_t t = 0; t < n_tokens; t++) {
        rope_cache_impl(positions[t], nd, a, mscale, cs, sn);
        rope_apply_impl(x + t * token_stride, n_heads, head_dim, nd, p->mode, cs, sn);
    }
    return CB_OK;
}

/* ------------------------------------------------------------------------------------- */
/* public: softmax, activations                                                          */

cb_status cb_softmax(float *x, int64_t n) {
    CHECK_N(n, "cb_softmax");
    CHECK_PTR(x, n, "cb_softmax", "x");
    if (n == 0) return CB_OK;
#if CB_OPS_X86
    if (use_avx2()) {
        softmax_avx2(x, n);
        return CB_OK;
    }
#endif
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    if (m == -INFINITY) {
        masked_row(x, n);
        return CB_OK;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
    return CB_OK;
}

static cb_status act_common(cb_act act, const float *x, const float *up, int64_t n, float *out,
                            const char *name) {
    CHECK_N(n, name);
    CHECK_PTR(x, n, name, "input");
    CHECK_PTR(out, n, name, "out");
    if (act == CB_ACT_SWIGLU_OAI && up) { /* (scalar: gpt-oss's experts, as ggml computes it) */
        for (int64_t i = 0; i < n; i++) {
            const float g = x[i] < 7.0f ? x[i] : 7.0f, u = up[i] < -7.0f ? -7.0f : up[i] > 7.0f ? 7.0f : up[i];
            out[i] = g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
        }
        return CB_OK;
    }
    if (act != CB_ACT_SILU && act != CB_ACT_GELU_TANH)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: unknown activation %d", name, (int)act);
    if (n == 0) return CB_OK;
#if CB_OPS_X86
    if (use_avx2()) {
        act_avx2(act, x, up, n, out);
        return CB_OK;
    }
#endif
    if (up) {
        for (int64_t i = 0; i < n; i++) out[i] = act_1(act, x[i]) * up[i];
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = act_1(act, x[i]);
    }
    return CB_OK;
}

cb_status cb_silu(const float *x, int64_t n, float *out) {
    return act_common(CB_ACT_SILU, x, NULL, n, out, "cb_silu");
}

cb_status cb_gelu_tanh(const float *x, int64_t n, float *out) {
    return act_common(CB_ACT_GELU_TANH, x, NULL, n, out, "cb_gelu_tanh");
}

cb_status cb_act_apply(cb_act act, const float *x, int64_t n, float *out) {
    return act_common(act, x, NULL, n, out, "cb_act_apply");
}

cb_status cb_glu(cb_act act, const float *gate, const float *up, int64_t n, float *out) {
    CHECK_PTR(up, n, "cb_glu", "up");
    return act_common(act, gate, up, n, out, "cb_glu");
}

/* ------------------------------------------------------------------------------------- */
/* public: elementwise                                                                   */

static cb_status binop(int op, const float *a, const float *b, int64_t n, float *out,
                       const char *name) {
    CHECK_N(n, name);
    if (n > 0 && (!a || !b || !out))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s: NULL pointer", name);
#if CB_OPS_X86
    if (use_avx2()) {
        binop_avx2(op, a, b, n, out);
        return CB_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) out[i] = op ? a[i] + b[i] : a[i] * b[i];
    return CB_OK;
}

cb_status cb_mul(const float *a, const float *b, int64_t n, float *out) {
    return binop(0, a, b, n, out, "cb_mul");
}

cb_status cb_add(const float *a, const float *b, int64_t n, float *out) {
    return binop(1, a, b, n, out, "cb_add");
}

cb_status cb_axpy(float a, const float *x, int64_t n, float *y) {
    CHECK_N(n, "cb_axpy");
    if (n > 0 && (!x || !y)) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_axpy: NULL pointer");
#if CB_OPS_X86
    if (use_avx2()) {
        axpy_avx2(a, x, n, y);
        return CB_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
    return CB_OK;
}

cb_status cb_scale(float *x, int64_t n, float s) {
    CHECK_N(n, "cb_scale");
    CHECK_PTR(x, n, "cb_scale", "x");
#if CB_OPS_X86
    if (use_avx2()) {
        scale_avx2(x, n, s);
        return CB_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return CB_OK;
}

cb_status cb_softcap(float *x, int64_t n, float cap) {
    CHECK_N(n, "cb_softcap");
    CHECK_PTR(x, n, "cb_softcap", "x");
    if (!(cap > 0.0f) || isinf(cap))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_softcap: cap %g must be finite and > 0",
                       (double)cap);
#if CB_OPS_X86
    if (use_avx2()) {
        softcap_avx2(x, n, cap);
        return CB_OK;
    }
#endif
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
    return CB_OK;
}

/* ------------------------------------------------------------------------------------- */
/* public: dot products                                                                  */

static float dot_any(const float *a, const float *b, int64_t n) {
#if CB_OPS_X86
    if (use_avx2()) return dot_avx2(a, b, n);
#endif
    return dot_scalar(a, b, n);
}

cb_status cb_dot_f32(const float *a, const float *b, int64_t n, float *out) {
    CHECK_N(n, "cb_dot_f32");
    if (!out || (n > 0 && (!a || !b)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_dot_f32: NULL pointer");
    *out = n ? dot_any(a, b, n) : 0.0f;
    return CB_OK;
}

cb_status cb_dot_rows_f32(const float *q, const float *k, int64_t n_rows, int64_t k_stride,
                          int64_t n, float scale, float *out) {
    CHECK_N(n, "cb_dot_rows_f32");
    if (n_rows < 0 || (n_rows > 1 && k_stride < n))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_dot_rows_f32: n_rows %lld, k_stride %lld < n %lld",
                       (long long)n_rows, (long long)k_stride, (long long)n);
    if (n_rows == 0) return CB_OK;
    if (!out || (n > 0 && (!q || !k)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_dot_rows_f32: NULL pointer");
    return cb_dot_rows_multi_f32(q, n, 1, k, n_rows, k_stride, n, scale, out, n_rows);
}

cb_status cb_dot_rows_multi_f32(const float *q, int64_t q_stride, int n_q, const float *k,
                                int64_t n_rows, int64_t k_stride, int64_t n, float scale,
                                float *out, int64_t o_stride) {
    CHECK_N(n, "cb_dot_rows_multi_f32");
    if (n_q < 0 || n_rows < 0 || (n_rows > 1 && k_stride < n) || (n_q > 1 && q_stride < n) ||
        (n_q > 1 && o_stride < n_rows))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_dot_rows_multi_f32: bad shape (n_q %d, n_rows %lld, n %lld, strides "
                       "q %lld k %lld out %lld)",
                       n_q, (long long)n_rows, (long long)n, (long long)q_stride,
                       (long long)k_stride, (long long)o_stride);
    if (n_rows == 0 || n_q == 0) return CB_OK;
    if (!out || (n > 0 && (!q || !k)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_dot_rows_multi_f32: NULL pointer");
    int64_t j0 = 0;
#if CB_OPS_X86
    if (n % 32 == 0 && use_avx512()) {
        for (; j0 + 8 <= n_rows; j0 += 8) {
            prefetch_rows8(k, j0 + 16, n_rows, k_stride, n);
            scores8_avx512(q, q_stride, n_q, k + j0 * k_stride, 0, k_stride, n, scale, out + j0, o_stride);
        }
    } else if (n % 32 == 0 && use_avx2())
        for (; j0 + 8 <= n_rows; j0 += 8) {
            prefetch_rows8(k, j0 + 16, n_rows, k_stride, n);
            for (int h = 0; h < n_q; h++)
                dot_rows8_avx2(q + h * q_stride, k + j0 * k_stride, k_stride, n, scale,
                               out + h * o_stride + j0);
        }
#endif
    for (int64_t j = j0; j < n_rows; j++)
        for (int h = 0; h < n_q; h++)
            out[h * o_stride + j] = n ? scale * dot_any(q + h * q_stride, k + j * k_stride, n) : 0.0f;
    return CB_OK;
}

cb_status cb_axpy_rows_multi_f32(const float *p, int64_t p_stride, int n_q, const float *v,
                                 int64_t n_rows, int64_t v_stride, int64_t n, float *y,
                                 int64_t y_stride) {
    CHECK_N(n, "cb_axpy_rows_multi_f32");
    if (n_q < 0 || n_rows < 0 || (n_rows > 1 && v_stride < n) || (n_q > 1 && y_stride < n) ||
        (n_q > 1 && p_stride < n_rows))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_axpy_rows_multi_f32: bad shape (n_q %d, n_rows %lld, n %lld, strides "
                       "p %lld v %lld y %lld)",
                       n_q, (long long)n_rows, (long long)n, (long long)p_stride,
                       (long long)v_stride, (long long)y_stride);
    if (n_rows == 0 || n_q == 0 || n == 0) return CB_OK;
    if (!p || !v || !y) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_axpy_rows_multi_f32: NULL pointer");
#if CB_OPS_X86
    const int avx2 = use_avx2();
    if (avx2 && n % 8 == 0) {
        axpy_rows_avx2(p, p_stride, n_q, v, n_rows, v_stride, n, y, y_stride);
        return CB_OK;
    }
#endif
    for (int64_t j = 0; j < n_rows; j++)
        for (int h = 0; h < n_q; h++) {
            const float a = p[h * p_stride + j], *x = v + j * v_stride;
            float *yh = y + h * y_stride;
#if CB_OPS_X86
            if (avx2) {
                axpy_avx2(a, x, n, yh);
                continue;
            }
#endif
            for (int64_t i = 0; i < n; i++) yh[i] += a * x[i];
        }
    return CB_OK;
}

/* f16 conversions of the f16 KV cache (ops.h): F16C's conversions round to nearest even as
 * cb_f32_to_f16 does, so both paths give the same bits (a NaN stays a NaN). */
void cb_f32_to_f16_n(const float *x, int64_t n, uint16_t *out) {
    int64_t i = 0;
#if CB_OPS_X86
    if (n > 0 && use_avx2()) i = narrow_f16_avx2(x, n, out);
#endif
    for (; i < n; i++) out[i] = cb_f32_to_f16(x[i]);
}

void cb_f16_round(float *x, int64_t n) {
    int64_t i = 0;
#if CB_OPS_X86
    if (n > 0 && use_avx2()) i = round_f16_avx2(x, n);
#endif
    for (; i < n; i++) x[i] = cb_f16_to_f32(cb_f32_to_f16(x[i]));
}

/* ---------------------------------------------------------------- f16 K/V rows
 * The f16 KV cache's attention: rows widened to floats, F16_CHUNK floats at a time on the stack
 * (L1-resident), then the f32 kernels above on them: the results are those of the f32 entry
 * points on the widened rows, bit for bit, while memory reads half the bytes. With AVX-512 the
 * score kernel reads the f16 rows itself (widened in registers, the same floats). */
#define F16_CHUNK 4096

static void widen_rows(const uint16_t *src, int64_t stride, int64_t rows, int64_t n, float *dst) {
    for (int64_t j = 0; j < rows; j++) {
#if CB_OPS_X86
        if (use_avx2()) {
            widen_f16_avx2(src + j * stride, n, dst + j * n);
            continue;
        }
#endif
        for (int64_t i = 0; i < n; i++) dst[j * n + i] = cb_f16_to_f32(src[j * stride + i]);
    }
}

/* rows of n floats per chunk: a multiple of 8 (the row kernels' group) when more than 8 fit */
/* Prefetch rows [j, j + rows) of n f16 values at stride into L2: the next chunk's, while this one
 * is widened and used (the widening otherwise waits on each chunk's reads). */
static void prefetch_f16_rows(const uint16_t *src, int64_t stride, int64_t j, int64_t rows,
                              int64_t n_rows, int64_t n) {
    for (int64_t r = j; r < j + rows && r < n_rows; r++)
        for (int64_t o = 0; o < n; o += 32) __builtin_prefetch(src + r * stride + o, 0, 1);
}

static int64_t chunk_rows(int64_t n) { /* 0 < n <= F16_CHUNK */
    int64_t r = F16_CHUNK / n;
    return r >= 16 ? r / 8 * 8 : r;
}

cb_status cb_dot_rows_multi_f16(const float *q, int64_t q_stride, int n_q, const uint16_t *k,
                                int64_t n_rows, int64_t k_stride, int64_t n, float scale,
                                float *out, int64_t o_stride) {
    CHECK_N(n, "cb_dot_rows_multi_f16");
    if (n_q < 0 || n_rows < 0 || (n_rows > 1 && k_stride < n) || (n_q > 1 && q_stride < n) ||
        (n_q > 1 && o_stride < n_rows) || n > F16_CHUNK)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_dot_rows_multi_f16: bad shape (n_q %d, n_rows %lld, n %lld (at most "
                       "%d), strides q %lld k %lld out %lld)",
                       n_q, (long long)n_rows, (long long)n, F16_CHUNK, (long long)q_stride,
                       (long long)k_stride, (long long)o_stride);
    if (n_rows == 0 || n_q == 0) return CB_OK;
    if (!out || (n > 0 && (!q || !k)))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_dot_rows_multi_f16: NULL pointer");
    if (n == 0) { /* empty rows: zero scores (k may be NULL) */
        for (int h = 0; h < n_q; h++)
            for (int64_t j = 0; j < n_rows; j++) out[h * o_stride + j] = 0.0f;
        return CB_OK;
    }
    int64_t j0 = 0;
#if CB_OPS_X86
    if (n % 32 == 0 && use_avx512()) /* rows widened in registers */
        for (; j0 + 8 <= n_rows; j0 += 8) {
            prefetch_f16_rows(k, k_stride, j0 + 16, 8, n_rows, n);
            scores8_avx512(q, q_stride, n_q, k + j0 * k_stride, 1, k_stride, n, scale, out + j0, o_stride);
        }
#endif
    float buf[F16_CHUNK];
    const int64_t cr = chunk_rows(n);
    for (; j0 < n_rows; j0 += cr) {
        const int64_t r = n_rows - j0 < cr ? n_rows - j0 : cr;
        prefetch_f16_rows(k, k_stride, j0 + cr, cr, n_rows, n);
        widen_rows(k + j0 * k_stride, k_stride, r, n, buf);
        cb_status s = cb_dot_rows_multi_f32(q, q_stride, n_q, buf, r, n, n, scale, out + j0, o_stride);
        if (s != CB_OK) return s;
    }
    return CB_OK;
}

cb_status cb_axpy_rows_multi_f16(const float *p, int64_t p_stride, int n_q, const uint16_t *v,
                                 int64_t n_rows, int64_t v_stride, int64_t n, float *y,
                                 int64_t y_stride) {
    CHECK_N(n, "cb_axpy_rows_multi_f16");
    if (n_q < 0 || n_rows < 0 || (n_rows > 1 && v_stride < n) || (n_q > 1 && y_stride < n) ||
        (n_q > 1 && p_stride < n_rows) || n > F16_CHUNK)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "cb_axpy_rows_multi_f16: bad shape (n_q %d, n_rows %lld, n %lld (at most "
                       "%d), strides p %lld v %lld y %lld)",
                       n_q, (long long)n_rows, (long long)n, F16_CHUNK, (long long)p_stride,
                       (long long)v_stride, (long long)y_stride);
    if (n_rows == 0 || n_q == 0 || n == 0) return CB_OK;
    if (!p || !v || !y) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "cb_axpy_rows_multi_f16: NULL pointer");
    float buf[F16_CHUNK];
    const int64_t cr = chunk_rows(n);
    for (int64_t j0 = 0; j0 < n_rows; j0 += cr) {
        const int64_t r = n_rows - j0 < cr ? n_rows - j0 : cr;
        prefetch_f16_rows(v, v_stride, j0 + cr, cr, n_rows, n);
        widen_rows(v + j0 * v_stride, v_stride, r, n, buf);
        cb_status s = cb_axpy_rows_multi_f32(p + j0, p_stride, n_q, buf, r, n, n, y, y_stride);
        if (s != CB_OK) return s;
    }
    return CB_OK;
}
