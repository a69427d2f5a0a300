/* AVX2 (+FMA, F16C) kernels for quant.c: activation quantizers and register-tiled dot products.
 *
 * Compiled for AVX2 with a target pragma whatever the build's -march, and only called when
 * cb_cpu_level() >= CB_SIMD_AVX2. The math is the scalar kernels' (quant.c): same activation
 * rounding (round-to-nearest-even of x*127/max|x|), exact int32 block sums, float scaling per
 * block; only the float summation order differs.
 * Tiles: a kernel computes nr (<= 4) weight rows against nt (<= 4) activation rows; a weight
 * block is unpacked once per row and reused for every token of the tile, and each activation
 * block is loaded once per row from L1.
 */
#include "quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#define INL static inline __attribute__((always_inline))

INL float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INL float hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 floats * id -> 32 int8 (round to nearest even); *sum16 gets the sums of each 16. */
INL __m256i quant32(const float *v, __m256 id, int *sum_lo, int *sum_hi) {
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v), id), rnd));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8), id), rnd));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 16), id), rnd));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 24), id), rnd));
    *sum_lo = hsum_epi32(_mm256_add_epi32(i0, i1));
    *sum_hi = hsum_epi32(_mm256_add_epi32(i2, i3));
    __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
    __m256i q = _mm256_packs_epi16(a, b);
    return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

INL float amax_n(const float *v, int n) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + j), absmask));
    return hmax_ps(m);
}

void cb_avx2_quantize_q8a(const float *x, int64_t n, void *dst) {
    cb_q8a_t *o = dst;
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const float *v = x + b * CB_QK;
        float amax = amax_n(v, CB_QK);
        float d = amax / 127.0f;
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        int s0, s1;
        _mm256_storeu_si256((__m256i *)(void *)o[b].qs, quant32(v, id, &s0, &s1));
        o[b].d = d;
        o[b].s = d * (float)(s0 + s1);
    }
}

void cb_avx2_quantize_q8k(const float *x, int64_t n, void *dst) {
    cb_q8k_t *o = dst;
    for (int64_t b = 0; b < n / CB_QKK; b++) {
        const float *v = x + b * CB_QKK;
        float amax = amax_n(v, CB_QKK);
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        o[b].d = amax / 127.0f;
        for (int k = 0; k < 8; k++) {
            int s0, s1;
            _mm256_storeu_si256((__m256i *)(void *)(o[b].qs + 32 * k),
                                quant32(v + 32 * k, id, &s0, &s1));
            o[b].bsums[2 * k] = (int16_t)s0;
            o[b].bsums[2 * k + 1] = (int16_t)s1;
        }
    }
}

cb_tile_fn cb_avx2_tile(int type) {
    (void)type;
    return NULL;
}

#pragma GCC pop_options
#else
/* Not x86-64 GCC/Clang: no AVX2 kernels (cb_cpu_level() is scalar there). */
cb_tile_fn cb_avx2_tile(int type) {
    (void)type;
    return NULL;
}
void cb_avx2_quantize_q8a(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
void cb_avx2_quantize_q8k(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
#endif
