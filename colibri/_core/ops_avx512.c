/* AVX-512 kernel of attention's score rows (ops.c, cb_dot_rows_multi_f32 and _f16): the per-row
 * partial sums of 8 K rows (f32, or f16 widened in registers) against n_q query heads,
 * bit-identical to the AVX2 kernel's (dot_rows8_avx2) on the rows as floats.
 *
 * Per (row, head) the AVX2 kernel keeps four 8-lane accumulators s0..s3, s_c summing the products
 * of values i + 8c + lane for i = 0, 32, 64, ... (one fma each), and reduces them to
 * t = (s0 + s1) + (s2 + s3), then t's lanes by a fixed tree. Here a 512-bit accumulator holds
 * s0|s1 (values i .. i + 15) and another s2|s3, so every lane sees the same fmas in the same
 * order, and t is added the same way; ops.c reduces t with the AVX2 code (one tree, one place).
 * What 512 bits buy: 32 registers hold the accumulators of 2 rows x 4 heads, so each K vector
 * loaded feeds 4 heads and each query vector 2 rows (the AVX2 kernel, with 16 registers, loads
 * 3 vectors per 2 fmas and is bound by its loads on the Zen4 VM; this one by its fmas).
 *
 * Emulation (tests): as quant_avx512.c (quant_avx512_impl.h), CB_AVX512_EMULATE compiles this
 * file on SIMDe under the names cb_avx512emu_* for tests/c/test_ops_avx512.c.
 * Ownership: every pointer is borrowed for one call; nothing is allocated. */
#include "quant_avx512_impl.h"

#if CB_AVX512_ON

/* Keeps a loaded vector in a register: left to itself GCC folds the loads into the fmas as
 * memory operands, loading each K vector once per head again (as many loads as fmas). */
#ifdef CB_AVX512_EMULATE
#define CB_IN_REG(v) ((void)0)
#else
#define CB_IN_REG(v) __asm__("" : "+v"(v))
#endif

/* K vector: 16 values at element o of a row, f32 or f16 (widened exactly: the same floats) */
INL __m512 load_k(const void *k, int64_t o, const int f16) {
    if (f16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)k + o)));
    return _mm512_loadu_ps((const float *)k + o);
}

/* Rows 0, 1 of k (f32 or f16 values, k_stride apart) against H heads (H <= 4; H and f16
 * constants where inlined): t of (head h, row r) to t[(h * 8 + r) * 8 ...]. */
INL void rows2(const float *q, int64_t q_stride, const void *k, int64_t k_stride, int64_t n,
               const int H, const int f16, float *t) {
    __m512 a[4][2][2]; /* [head][row][s0|s1, s2|s3] */
    for (int h = 0; h < H; h++)
        for (int r = 0; r < 2; r++) a[h][r][0] = a[h][r][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 32)
        for (int x = 0; x < 2; x++) {
            __m512 k0 = load_k(k, i + 16 * x, f16);
            __m512 k1 = load_k(k, k_stride + i + 16 * x, f16);
            CB_IN_REG(k0);
            CB_IN_REG(k1);
            for (int h = 0; h < H; h++) {
                __m512 qv = _mm512_loadu_ps(q + h * q_stride + i + 16 * x);
                CB_IN_REG(qv);
                a[h][0][x] = _mm512_fmadd_ps(qv, k0, a[h][0][x]);
                a[h][1][x] = _mm512_fmadd_ps(qv, k1, a[h][1][x]);
            }
        }
    for (int h = 0; h < H; h++)
        for (int r = 0; r < 2; r++) {
            const __m256 s01 = _mm256_add_ps(_mm512_castps512_ps256(a[h][r][0]), hi_ps(a[h][r][0]));
            const __m256 s23 = _mm256_add_ps(_mm512_castps512_ps256(a[h][r][1]), hi_ps(a[h][r][1]));
            _mm256_storeu_ps(t + (h * 8 + r) * 8, _mm256_add_ps(s01, s23));
        }
}

INL void rows8(const float *q, int64_t q_stride, int n_q, const void *k, int64_t k_stride,
               int64_t n, const int f16, float *t) {
    const size_t el = f16 ? 2 : 4;
    for (int h0 = 0; h0 < n_q; h0 += 4) {
        const float *qh = q + h0 * q_stride;
        float *th = t + h0 * 64;
        for (int r0 = 0; r0 < 8; r0 += 2) {
            const void *kr = (const uint8_t *)k + (size_t)(r0 * k_stride) * el;
            switch (n_q - h0) {
            case 1: rows2(qh, q_stride, kr, k_stride, n, 1, f16, th + r0 * 8); break;
            case 2: rows2(qh, q_stride, kr, k_stride, n, 2, f16, th + r0 * 8); break;
            case 3: rows2(qh, q_stride, kr, k_stride, n, 3, f16, th + r0 * 8); break;
            default: rows2(qh, q_stride, kr, k_stride, n, 4, f16, th + r0 * 8); break;
            }
        }
    }
}

/* t[(h * 8 + r) * 8 + lane], h < n_q, r < 8: the 8-lane sums of row r of k (rows k_stride apart)
 * against head h of q (heads q_stride apart), n values (a multiple of 32). */
CB_AVX512_TARGET void CB_AVX512_FN(dot_rows8_t)(const float *q, int64_t q_stride, int n_q,
                                                 const float *k, int64_t k_stride, int64_t n,
                                                 float *t) {
    rows8(q, q_stride, n_q, k, k_stride, n, 0, t);
}

/* The same of f16 rows: the sums of the rows widened to floats. */
CB_AVX512_TARGET void CB_AVX512_FN(dot_rows8_t_f16)(const float *q, int64_t q_stride, int n_q,
                                                     const uint16_t *k, int64_t k_stride,
                                                     int64_t n, float *t) {
    rows8(q, q_stride, n_q, k, k_stride, n, 1, t);
}

#endif
