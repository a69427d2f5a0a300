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
        o[b].isum = s0 + s1;
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

/* Decode (one token) streams each weight row once, and rows are short (a few KiB), so the
 * hardware prefetcher restarts at every row. While a tile reads rows r..r+NR-1 at some offset,
 * prefetch the same offset of the next tile's rows (they follow in memory). */
INL void prefetch_span(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + bytes - 1, 0, 3);
}

/* ------------------------------------------------------------ 32-blocks with cb_q8a_t */

INL float f16(const uint8_t *p) { return _cvtsh_ss(cb_rd16(p)); }

/* An f16 broadcast to 8 floats: a broadcast load and one conversion. */
INL __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_set1_epi16((short)cb_rd16(p))); }

/* 16 bytes of nibbles -> 32 bytes: values 0..15 from the low nibbles, 16..31 from the high. */
INL __m256i nibbles(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* bit j of the 32-bit qh -> 0x10 in byte j (Q5_0/Q5_1 fifth bit). */
INL __m256i fifth_bits(const uint8_t *p) {
    __m256i v = _mm256_set1_epi32((int)cb_rd32(p));
    v = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* 16 bytes of interleaved nibbles -> 32 bytes: byte i gives values 2i (low) and 2i+1 (high). */
INL __m256i nibbles_interleaved(const uint8_t *p) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

/* Unpacks one block: w (signed int8 for the symmetric types, unsigned for Q4_1/Q5_1), d, m. */
INL __m256i unpack32(int type, const uint8_t *b, __m256 *d, float *m) {
    switch (type) {
    case CB_TYPE_Q4_0: /* unsigned here; the zero point 8 is taken out with isum */
        *d = f16x8(b);
        return nibbles(b + 2);
    case CB_TYPE_Q4_1:
        *d = f16x8(b);
        *m = f16(b + 2);
        return nibbles(b + 4);
    case CB_TYPE_Q5_0: /* unsigned here; the zero point 16 is taken out with isum */
        *d = f16x8(b);
        return _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
    case CB_TYPE_Q5_1:
        *d = f16x8(b);
        *m = f16(b + 2);
        return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4));
    case CB_TYPE_Q8_0:
        *d = f16x8(b);
        return _mm256_loadu_si256((const __m256i *)(const void *)(b + 2));
    case CB_TYPE_I4_G128: /* b: the quarter's 16 bytes; the scale is 2 + 16*quarter before */
        return nibbles_interleaved(b);
    default: { /* MXFP4 */
        *d = _mm256_set1_ps(cb_e8m0_half(b[0]));
        const __m256i table = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)cb_mxfp4_values));
        return _mm256_shuffle_epi8(table, nibbles(b + 1));
    }
    }
}

INL size_t bytes32(int type) {
    switch (type) {
    case CB_TYPE_Q4_0: return 18;
    case CB_TYPE_Q4_1: return 20;
    case CB_TYPE_Q5_0: return 22;
    case CB_TYPE_Q5_1: return 24;
    case CB_TYPE_Q8_0: return 34;
    case CB_TYPE_I4_G128: return 66;
    default: return 17;
    }
}

INL void tile32(int type, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const int offset = type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1;
    /* Q4_0/Q5_0: unsigned q times x, minus zero point * sum(x): spread over the 8 lanes of the
     * int32 partial sums that is isum (Q4_0: 8*isum/8) or 2*isum (Q5_0) per lane. */
    const int zp = type == CB_TYPE_Q4_0 || type == CB_TYPE_I4_G128 ? 1
                   : (type == CB_TYPE_Q5_0 ? 2 : 0);
    const int unsig = offset || zp;
    const size_t bb = bytes32(type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][4];
    float off[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm256_setzero_ps();
            off[r][t] = 0.0f;
        }
    for (int64_t b = 0; b < nb; b++) {
        /* unpack the NR weight blocks once, then let every token pass over them (each token's
         * scale and sum are broadcast once per block, not once per row) */
        __m256i wq[2], aw[2];
        __m256 dv[2];
        float m[2] = {0.0f, 0.0f};
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            if (type == CB_TYPE_I4_G128) {
                /* activation block b is quarter b%4 of weight block b/4 */
                const uint8_t *blk = w + (size_t)r * ws + (size_t)(b >> 2) * bb;
                if (NT == 1 && (b & 3) == 0) prefetch_span(blk + (size_t)NR * ws, bb);
                dv[r] = f16x8(blk);
                wq[r] = unpack32(type, blk + 2 + 16 * (b & 3), &dv[r], &m[r]);
            } else {
                if (NT == 1) __builtin_prefetch(w + (size_t)(r + NR) * ws + (size_t)b * bb, 0, 3);
                wq[r] = unpack32(type, w + (size_t)r * ws + (size_t)b * bb, &dv[r], &m[r]);
            }
            aw[r] = unsig ? wq[r] : _mm256_sign_epi8(wq[r], wq[r]);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
            const __m256 dx = _mm256_broadcast_ss(&a->d);
            const __m256i zs = _mm256_set1_epi32(a->isum);
            #pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)a->qs);
                if (!unsig) xv = _mm256_sign_epi8(xv, wq[r]);
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], xv), ones);
                if (zp) {
                    p = _mm256_sub_epi32(p, zs);
                    if (zp == 2) p = _mm256_sub_epi32(p, zs);
                }
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv[r], dx),
                                            acc[r][t]);
                if (offset) off[r][t] += m[r] * a->s;
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]) + off[r][t];
}

/* ------------------------------------------------------------ K-quants with cb_q8k_t */

INL void tile_q4k(int q5, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const size_t bb = q5 ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * bb;
            if (NT == 1) prefetch_span(blk + (size_t)NR * ws, bb);
            const uint8_t *qs = blk + (q5 ? 48 : 16);
            float d = f16(blk), dmin = f16(blk + 2);
            /* the 12 packed bytes -> bytes sc[0..7], m[0..7] (6 bits each, see
             * cb_scale_min_k4) with 32-bit word operations */
            uint32_t u[4];
            memcpy(u, blk + 4, 12);
            u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
            uint32_t m_lo = u[1] & 0x3F3F3F3Fu;
            u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
            u[2] = m_lo;
            u[0] &= 0x3F3F3F3Fu;
            __m128i scm = _mm_loadu_si128((const __m128i *)(const void *)u);
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
            __m256i qhv = q5 ? _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16))
                             : _mm256_setzero_si256();
            __m256i isum[4];
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
            /* not unrolled: unrolling makes GCC hoist all four chunks and spill */
            #pragma GCC unroll 1
            for (int j2 = 0; j2 < 4; j2++) {
                __m256i qb = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j2));
                __m256i lo = _mm256_and_si256(qb, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
                if (q5) {
                    const __m256i b16 = _mm256_set1_epi8(0x10);
                    __m256i ml = _mm256_set1_epi8((char)(1 << (2 * j2)));
                    __m256i mh = _mm256_set1_epi8((char)(1 << (2 * j2 + 1)));
                    lo = _mm256_or_si256(lo, _mm256_and_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(qhv, ml), ml), b16));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(qhv, mh), mh), b16));
                }
                __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * j2))));
                __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * j2 + 1))));
                #pragma GCC unroll 8
                for (int t = 0; t < NT; t++) {
                    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                    __m256i xl = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 64 * j2));
                    __m256i xh = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 64 * j2 + 32));
                    __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), slo);
                    __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), shi);
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(pl, ph));
                }
            }
            __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
                scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)a->bsums);
                __m256i mm = _mm256_madd_epi16(bs, mins);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * a->d),
                                            acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dmin * a->d),
                                             acc[r][t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]);
}

INL void tile_q6k(int unused, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)unused;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * 210;
            if (NT == 1) prefetch_span(blk + (size_t)NR * ws, 210);
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d = f16(blk + 208);
            /* scales as int16: lo = groups 0..7, hi = groups 8..15, each in both lanes */
            __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
            __m256i sch[2] = {_mm256_permute2x128_si256(scw, scw, 0x00),
                              _mm256_permute2x128_si256(scw, scw, 0x11)};
            __m256i isum[4];
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
            #pragma GCC unroll 1
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
                __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)ql);
                __m256i qb = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
                __m256i hv = _mm256_loadu_si256((const __m256i *)(const void *)qh);
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(qa, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(qb, m4),
                                       _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                       _mm256_and_si256(hv, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
                #pragma GCC unroll 8
                for (int k = 0; k < 4; k++) {
                    /* groups 8h+2k (low lane) and 8h+2k+1 (high lane) */
                    __m256i s16 = _mm256_shuffle_epi8(sch[h], _mm256_setr_epi8(
                        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1),
                        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1),
                        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1),
                        (char)(4 * k), (char)(4 * k + 1), (char)(4 * k), (char)(4 * k + 1),
                        (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3),
                        (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3),
                        (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3),
                        (char)(4 * k + 2), (char)(4 * k + 3), (char)(4 * k + 2), (char)(4 * k + 3)));
                    #pragma GCC unroll 8
                    for (int t = 0; t < NT; t++) {
                        const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                        __m256i xv = _mm256_loadu_si256(
                            (const __m256i *)(const void *)(a->qs + 128 * h + 32 * k));
                        isum[t] = _mm256_add_epi32(
                            isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), s16));
                    }
                }
            }
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)a->bsums);
                __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bs, scw), 5);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], corr)),
                                            _mm256_set1_ps(d * a->d), acc[r][t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]);
}

/* ------------------------------------------------------------ float weights */

INL __m256 load8(int type, const uint8_t *p) {
    if (type == CB_TYPE_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (type == CB_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

INL float load1(int type, const uint8_t *p) {
    if (type == CB_TYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    return type == CB_TYPE_F16 ? _cvtsh_ss(cb_rd16(p)) : cb_bf16_to_f32(cb_rd16(p));
}

INL void tile_float(int type, int NR, int NT, int64_t n, const uint8_t *w, size_t ws,
                    const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const size_t es = type == CB_TYPE_F32 ? 4 : 2;
    __m256 acc[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            __m256 wv = load8(type, w + (size_t)r * ws + (size_t)c * es);
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[r][t] = _mm256_fmadd_ps(
                    wv, _mm256_loadu_ps((const float *)(const void *)(x + (size_t)t * xs) + c),
                    acc[r][t]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            float s = hsum_ps(acc[r][t]);
            const float *xf = (const float *)(const void *)(x + (size_t)t * xs);
            for (int64_t cc = c; cc < n; cc++) s += load1(type, w + (size_t)r * ws + (size_t)cc * es) * xf[cc];
            out[(r + r_off) * out_nt + t] = s;
        }
}

/* ------------------------------------------------------------ dispatch: rows in pairs */

#define CB_DEFINE_TILE(NAME, BODY, TYPE)                                                        \
    static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,         \
                     size_t xs, int nt, float *out) {                                          \
        for (int r = 0; r < nr; r += 2) {                                                      \
            const uint8_t *wr = w + (size_t)r * ws;                                            \
            if (nr - r >= 2) {                                                                 \
                switch (nt) {                                                                  \
                case 1: BODY(TYPE, 2, 1, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 2: BODY(TYPE, 2, 2, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 3: BODY(TYPE, 2, 3, n, wr, ws, x, xs, out, nt, r); break;                 \
                default: BODY(TYPE, 2, 4, n, wr, ws, x, xs, out, nt, r); break;                \
                }                                                                              \
            } else {                                                                           \
                switch (nt) {                                                                  \
                case 1: BODY(TYPE, 1, 1, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 2: BODY(TYPE, 1, 2, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 3: BODY(TYPE, 1, 3, n, wr, ws, x, xs, out, nt, r); break;                 \
                default: BODY(TYPE, 1, 4, n, wr, ws, x, xs, out, nt, r); break;                \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

CB_DEFINE_TILE(tile_avx2_q4_0, tile32, CB_TYPE_Q4_0)
CB_DEFINE_TILE(tile_avx2_q4_1, tile32, CB_TYPE_Q4_1)
CB_DEFINE_TILE(tile_avx2_q5_0, tile32, CB_TYPE_Q5_0)
CB_DEFINE_TILE(tile_avx2_q5_1, tile32, CB_TYPE_Q5_1)
CB_DEFINE_TILE(tile_avx2_q8_0, tile32, CB_TYPE_Q8_0)
CB_DEFINE_TILE(tile_avx2_mxfp4, tile32, CB_TYPE_MXFP4)
CB_DEFINE_TILE(tile_avx2_i4g128, tile32, CB_TYPE_I4_G128)
CB_DEFINE_TILE(tile_avx2_q4_k, tile_q4k, 0)
CB_DEFINE_TILE(tile_avx2_q5_k, tile_q4k, 1)
CB_DEFINE_TILE(tile_avx2_q6_k, tile_q6k, 0)
CB_DEFINE_TILE(tile_avx2_f32, tile_float, CB_TYPE_F32)
CB_DEFINE_TILE(tile_avx2_f16, tile_float, CB_TYPE_F16)
CB_DEFINE_TILE(tile_avx2_bf16, tile_float, CB_TYPE_BF16)

cb_tile_fn cb_avx2_tile(int type) {
    switch (type) {
    case CB_TYPE_F32: return tile_avx2_f32;
    case CB_TYPE_F16: return tile_avx2_f16;
    case CB_TYPE_BF16: return tile_avx2_bf16;
    case CB_TYPE_Q4_0: return tile_avx2_q4_0;
    case CB_TYPE_Q4_1: return tile_avx2_q4_1;
    case CB_TYPE_Q5_0: return tile_avx2_q5_0;
    case CB_TYPE_Q5_1: return tile_avx2_q5_1;
    case CB_TYPE_Q8_0: return tile_avx2_q8_0;
    case CB_TYPE_MXFP4: return tile_avx2_mxfp4;
    case CB_TYPE_I4_G128: return tile_avx2_i4g128;
    case CB_TYPE_Q4_K: return tile_avx2_q4_k;
    case CB_TYPE_Q5_K: return tile_avx2_q5_k;
    case CB_TYPE_Q6_K: return tile_avx2_q6_k;
    default: return NULL;
    }
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
