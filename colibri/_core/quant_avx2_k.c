/* AVX2 (+FMA, F16C) kernels of the K-quants (Q4_K, Q5_K, Q6_K: super-blocks of 256 values,
 * activations as cb_q8k_t) for quant.c: the register-tiled dot products and the packed-row
 * matmul (packing and tile). quant_avx2.c's opening comment describes the tiles, the batch
 * invariance and the packed rows; it dispatches here through cb_avx2_k_tile, cb_avx2_k_rp_pack,
 * cb_avx2_k_rp_tile and cb_avx2_k_rp_group_bytes. The math is the scalar kernels' (quant.c):
 * exact int32 sums of q*x per sub-block, scaled by the 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K)
 * sub-block scales in the integers, then d*dx (and dmin*dx against the activation's bsums for
 * the mins) in float; only the float summation order differs.
 * Compiled for AVX2 with a target pragma whatever the build's -march, and only called when
 * cb_cpu_level() >= CB_SIMD_AVX2. Every pointer is borrowed for one call.
 */
#include "quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "quant_avx2_impl.h"

/* ------------------------------------------------------------ K-quants with cb_q8k_t */

/* The values of sub-blocks 2*j2 (*lo) and 2*j2 + 1 (*hi) of a Q4_K/Q5_K super-block (qs: its
 * nibbles; qhv: Q5_K's fifth bits) as 32 unsigned bytes each. */
INL void k4_values(int q5, const uint8_t *qs, __m256i qhv, int j2, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i qb = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j2));
    *lo = _mm256_and_si256(qb, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
    if (q5) {
        const __m256i b16 = _mm256_set1_epi8(0x10);
        const __m256i ml = _mm256_set1_epi8((char)(1 << (2 * j2)));
        const __m256i mh = _mm256_set1_epi8((char)(1 << (2 * j2 + 1)));
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qhv, ml), ml), b16));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qhv, mh), mh), b16));
    }
}

/* The 12 scale bytes of a Q4_K/Q5_K super-block (at p12; 16 bytes are read) as bytes
 * [sc0..sc7, m0..m7] (6 bits each), in vector registers (cb_k4_scale_words' unpacking). */
INL __m128i k4_scales(const uint8_t *p12) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p12);
    const __m128i lo = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i hi = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    __m128i a = _mm_and_si128(lo, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    __m128i b = _mm_and_si128(_mm_srli_epi16(lo, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    __m128i c = _mm_and_si128(_mm_srli_epi16(hi, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(_mm_or_si128(a, b), c);
}

/* Shuffles broadcasting int16 scale j of a 128-bit lane to all its words. */
static const uint8_t k4_scale_shuf[8][32] __attribute__((aligned(32))) = {
#define S2(j) 2 * (j), 2 * (j) + 1
#define S16(j) S2(j), S2(j), S2(j), S2(j), S2(j), S2(j), S2(j), S2(j)
    {S16(0), S16(0)}, {S16(1), S16(1)}, {S16(2), S16(2)}, {S16(3), S16(3)},
    {S16(4), S16(4)}, {S16(5), S16(5)}, {S16(6), S16(6)}, {S16(7), S16(7)},
#undef S16
#undef S2
};

/* Q6_K: int16 scale 2k (low lane) and 2k+1 (high lane) of a half's 8 to every word. */
static const uint8_t k6_scale_shuf[4][32] __attribute__((aligned(32))) = {
#define P2(j) 2 * (j), 2 * (j) + 1
#define P8(j) P2(j), P2(j), P2(j), P2(j), P2(j), P2(j), P2(j), P2(j)
    {P8(0), P8(1)}, {P8(2), P8(3)}, {P8(4), P8(5)}, {P8(6), P8(7)},
#undef P8
#undef P2
};

/* The 6-bit values (unsigned, q + 32) of one half of a Q6_K super-block (ql: its 64 low-bit
 * bytes, qh: its 32 high-bit bytes) as 4 x 32 bytes: q[k] = values 32k..32k+31 of the half. */
INL void k6_values(const uint8_t *ql, const uint8_t *qh, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)ql);
    const __m256i qb = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
    const __m256i hv = _mm256_loadu_si256((const __m256i *)(const void *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), _mm256_and_si256(hv, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(hv, 2), m30));
}

INL void tile_q4k(int q5, int INV, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const size_t bb = q5 ? 176 : 144;
    __m256 acc[4][4];
    __m256 vacc = _mm256_setzero_ps(); /* INV: lanes k = r * NT + t */
    __m256i pv[8], mv[8];
    float scd[8] = {0}, smn[8] = {0};
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * bb;
            prefetch_span(blk + (size_t)NR * CB_DEC_PF * ws, bb);
            const uint8_t *qs = blk + (q5 ? 48 : 16);
            float d = f16(blk), dmin = f16(blk + 2);
            __m128i scm = k4_scales(blk + 4);
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(scm));
            __m256i qhv = q5 ? _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16))
                             : _mm256_setzero_si256();
            __m256i isum[4];
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
            /* not unrolled: unrolling makes GCC hoist all four chunks and spill */
            #pragma GCC unroll 1
            for (int j2 = 0; j2 < 4; j2++) {
                __m256i lo, hi;
                k4_values(q5, qs, qhv, j2, &lo, &hi);
                __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)(const void *)k4_scale_shuf[2 * j2]));
                __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)(const void *)k4_scale_shuf[2 * j2 + 1]));
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
                if (INV) {
                    pv[r * NT + t] = isum[t];
                    mv[r * NT + t] = mm;
                    scd[r * NT + t] = d * a->d;
                    smn[r * NT + t] = dmin * a->d;
                    continue;
                }
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * a->d),
                                            acc[r][t]);
                acc[r][t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dmin * a->d),
                                             acc[r][t]);
            }
        }
        if (INV) {
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(pv, NR * NT)), set8(scd), vacc);
            vacc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(mv, NR * NT)), set8(smn), vacc);
        }
    }
    if (INV) {
        store_lanes(vacc, NR, NT, out, out_nt, r_off);
        return;
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]);
}

/* A super-block's exact integer sums against one activation block: *isum (8 lanes to add) of
 * q*x scaled by the sub-block scales, *msum (8 lanes) of the mins times the activation sums. */
INL void k4_block(int q5, const uint8_t *blk, const cb_q8k_t *a, __m256i *isum, __m256i *msum) {
    const __m128i s = k4_scales(blk + 4);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(s));
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    __m256i qhv = q5 ? _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16)) : _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int j2 = 0; j2 < 4; j2++) {
        __m256i lo, hi;
        k4_values(q5, qs, qhv, j2, &lo, &hi);
        __m256i xl = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 64 * j2));
        __m256i xh = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 64 * j2 + 32));
        __m256i slo = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)(const void *)k4_scale_shuf[2 * j2]));
        __m256i shi = _mm256_shuffle_epi8(sc16, _mm256_load_si256((const __m256i *)(const void *)k4_scale_shuf[2 * j2 + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), slo),
                                                     _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), shi)));
    }
    *isum = acc;
    __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
        s, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    *msum = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(const void *)a->bsums), mins);
}

/* A Q6_K super-block's exact integer sum against one activation block, in 8 lanes to add:
 * the scaled q*x sums minus 32 * the scaled activation sums (q is stored unsigned + 32). */
INL __m256i k6_block(const uint8_t *blk, const cb_q8k_t *a) {
    const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
    const __m256i schs[2] = {_mm256_permute2x128_si256(scw, scw, 0x00),
                             _mm256_permute2x128_si256(scw, scw, 0x11)};
    __m256i acc = _mm256_setzero_si256();
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i sch = schs[h];
        __m256i q[4];
        k6_values(blk + 64 * h, blk + 128 + 32 * h, q);
        #pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            /* groups 8h+2k (low lane) and 8h+2k+1 (high lane) */
            __m256i s16 = _mm256_shuffle_epi8(sch, _mm256_load_si256((const __m256i *)(const void *)k6_scale_shuf[k]));
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 128 * h + 32 * k));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], xv), s16));
        }
    }
    __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)a->bsums);
    return _mm256_sub_epi32(acc, _mm256_slli_epi32(_mm256_madd_epi16(bs, scw), 5));
}

/* Decode (one token), batch-invariant: nr rows one after the other, so that a task reads one
 * sequential stream (the hardware prefetcher follows it; interleaved rows are short streams it
 * restarts on), CB_DEC_PF_BYTES ahead prefetched. Per row, up to 4 super-blocks (8 for Q6_K)
 * share one reduction (lanes: the integer sums, then for Q4_K/Q5_K the min sums), then the
 * element's float chain in block order: acc = fma(isum, d * dx, acc) (Q4_K/Q5_K: then
 * acc = fnma(msum, dmin * dx, acc)). */
INL void rows_k_dec(int type, int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                    float *out) {
    const int q6 = type == CB_TYPE_Q6_K, q5 = type == CB_TYPE_Q5_K;
    const size_t bb = q6 ? 210 : (q5 ? 176 : 144);
    const int G = q6 ? 8 : 4;
    const cb_q8k_t *xa = (const cb_q8k_t *)(const void *)x;
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = w + (size_t)r * ws;
        float acc = 0.0f;
        for (int64_t b0 = 0; b0 < nb; b0 += G) {
            const int n = nb - b0 < G ? (int)(nb - b0) : G;
            __m256i v[8];
            #pragma GCC unroll 8
            for (int k = 0; k < G; k++) {
                if (k < n) {
                    const uint8_t *blk = row + (size_t)(b0 + k) * bb;
                    prefetch_span_l1(blk + CB_DEC_PF_BYTES, bb);
                    if (q6)
                        v[k] = k6_block(blk, xa + b0 + k);
                    else
                        k4_block(q5, blk, xa + b0 + k, &v[k], &v[4 + k]);
                } else {
                    v[k] = _mm256_setzero_si256();
                    if (!q6) v[4 + k] = v[k];
                }
            }
            float f[8];
            _mm256_storeu_ps(f, _mm256_cvtepi32_ps(reduce_lanes(v, 8)));
            for (int k = 0; k < n; k++) {
                const uint8_t *blk = row + (size_t)(b0 + k) * bb;
                const float dx = xa[b0 + k].d;
                if (q6) {
                    acc = fma1(f[k], f16(blk + 208) * dx, acc);
                } else {
                    acc = fma1(f[k], f16(blk) * dx, acc);
                    acc = fma1(-f[4 + k], f16(blk + 2) * dx, acc);
                }
            }
        }
        out[r] = acc;
    }
}

INL void tile_q6k(int unused, int INV, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)unused;
    __m256 acc[4][4];
    __m256 vacc = _mm256_setzero_ps(); /* INV: lanes k = r * NT + t */
    __m256i pv[8];
    float scd[8] = {0};
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * 210;
            prefetch_span(blk + (size_t)NR * CB_DEC_PF * ws, 210);
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
                __m256i q[4];
                k6_values(blk + 64 * h, blk + 128 + 32 * h, q);
                #pragma GCC unroll 8
                for (int k = 0; k < 4; k++) {
                    /* groups 8h+2k (low lane) and 8h+2k+1 (high lane) */
                    __m256i s16 = _mm256_shuffle_epi8(
                        sch[h], _mm256_load_si256((const __m256i *)(const void *)k6_scale_shuf[k]));
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
                if (INV) {
                    pv[r * NT + t] = _mm256_sub_epi32(isum[t], corr);
                    scd[r * NT + t] = d * a->d;
                    continue;
                }
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], corr)),
                                            _mm256_set1_ps(d * a->d), acc[r][t]);
            }
        }
        if (INV)
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(pv, NR * NT)), set8(scd), vacc);
    }
    if (INV) {
        store_lanes(vacc, NR, NT, out, out_nt, r_off);
        return;
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]);
}

/* the tile bodies take the Q5_K flag, the decode walk the type */
#define rows_k_dec_q4(q5, ...) rows_k_dec(CB_TYPE_Q4_K, __VA_ARGS__)
#define rows_k_dec_q5(q5, ...) rows_k_dec(CB_TYPE_Q5_K, __VA_ARGS__)
#define rows_k_dec_q6(q5, ...) rows_k_dec(CB_TYPE_Q6_K, __VA_ARGS__)
CB_DEFINE_TILE_DEC(tile_avx2_q4_k, tile_q4k, 0, rows_k_dec_q4)
CB_DEFINE_TILE_DEC(tile_avx2_q5_k, tile_q4k, 1, rows_k_dec_q5)
CB_DEFINE_TILE_DEC(tile_avx2_q6_k, tile_q6k, 0, rows_k_dec_q6)
CB_DEFINE_TILE(tile_avx2_fast_q4_k, tile_q4k, 0, 0)
CB_DEFINE_TILE(tile_avx2_fast_q5_k, tile_q4k, 1, 0)
CB_DEFINE_TILE(tile_avx2_fast_q6_k, tile_q6k, 0, 0)

/* K-quants packed the same way, per super-block of 256 values and 8 rows: 64 steps of
 * [8 rows x 4 bytes] (unsigned q: 0..15 Q4_K, 0..31 Q5_K, 0..63 Q6_K with zero point 32), then
 * NS scale vectors (one per sub-block: 8 of 32 values, Q6_K 16 of 16; int16 pairs per row lane,
 * for _mm256_madd_epi16), 8 "min" vectors (int16 pairs per row lane multiplying the activation's
 * bsums pairs (2k, 2k+1): Q4_K/Q5_K (m_k, m_k), Q6_K (32 sc_2k, 32 sc_2k+1)), then d[8] and
 * dmin[8] (Q6_K: d again) as floats. Activations stay cb_q8k_t. Per super-block and row:
 * d*dx*sum_j sc_j*sum(q x) - dmin*dx*sum_k min_k . bsums_k, the scalar kernels' integers. */
INL int rpk_ns(int type) { return type == CB_TYPE_Q6_K ? 16 : 8; }
INL int rpk_g(int type) { return type == CB_TYPE_Q4_K ? 8 : (type == CB_TYPE_Q5_K ? 4 : 2); }
INL size_t rpk_bstride(int type) {
    return 2048 + (size_t)(type == CB_TYPE_Q6_K ? 16 : 8) * 32 + 256 + 64;
}

/* One super-block of one row: ch[c] = values 32c..32c+31 (unsigned q), sc[0] / sc[1] = the
 * int32 scales of sub-blocks 0..7 / 8..15 (Q6_K's signed), *mn = 8 int32 words, word k the int16
 * pair (mn_2k, mn_2k+1) of the min terms (Q4_K/Q5_K: (m_k, m_k); Q6_K: (32 sc_2k, 32 sc_2k+1)). */
INL void rpk_unpack(int type, const uint8_t *blk, __m256i *ch, __m256i *sc, __m256i *mn,
                    float *d, float *dmin) {
    if (type == CB_TYPE_Q6_K) {
        for (int h = 0; h < 2; h++) k6_values(blk + 64 * h, blk + 128 + 32 * h, ch + 4 * h);
        const __m128i s8 = _mm_loadu_si128((const __m128i *)(const void *)(blk + 192));
        sc[0] = _mm256_cvtepi8_epi32(s8);
        sc[1] = _mm256_cvtepi8_epi32(_mm_srli_si128(s8, 8));
        *mn = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
        *d = f16(blk + 208);
        *dmin = *d;
        return;
    }
    const int q5 = type == CB_TYPE_Q5_K;
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    __m256i qhv = q5 ? _mm256_loadu_si256((const __m256i *)(const void *)(blk + 16))
                     : _mm256_setzero_si256();
    for (int c2 = 0; c2 < 4; c2++) k4_values(q5, qs, qhv, c2, &ch[2 * c2], &ch[2 * c2 + 1]);
    const __m128i s16 = k4_scales(blk + 4); /* bytes sc[0..7], m[0..7] */
    sc[0] = _mm256_cvtepu8_epi32(s16);
    sc[1] = _mm256_setzero_si256();
    __m256i m32 = _mm256_cvtepu8_epi32(_mm_srli_si128(s16, 8));
    *mn = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
    *d = f16(blk);
    *dmin = f16(blk + 2);
}

/* Unpacks rows r0..r0+7 of a group (zeros past nr) and transposes them: q[8*c + i] = word i of
 * chunk c (values 32c+4i..+3) of the 8 rows; s[j] = sub-block j's int32 scale of the 8 rows
 * (j < 16); m[k] = the 8 rows' min pairs k; d, dmin per row. */
INL void rpk_unpack8(int type, const uint8_t *w, size_t ws, int r0, int nr, int64_t b,
                     __m256i *q, __m256i *s, __m256i *m, float *d, float *dmin) {
    const size_t bb = cb_type_block_bytes(type);
    __m256i ch[8][8], sc[2][8], mn[8];
    for (int r = 0; r < 8; r++) {
        if (r0 + r < nr) {
            __m256i scr[2];
            rpk_unpack(type, w + (size_t)(r0 + r) * ws + (size_t)b * bb, ch[r], scr, &mn[r], &d[r],
                       &dmin[r]);
            sc[0][r] = scr[0];
            sc[1][r] = scr[1];
        } else {
            for (int c = 0; c < 8; c++) ch[r][c] = _mm256_setzero_si256();
            sc[0][r] = sc[1][r] = mn[r] = _mm256_setzero_si256();
            d[r] = dmin[r] = 0.0f;
        }
    }
    for (int c = 0; c < 8; c++) {
        __m256i v[8];
        for (int r = 0; r < 8; r++) v[r] = ch[r][c];
        transpose8(v, q + 8 * c);
    }
    transpose8(sc[0], s);
    transpose8(sc[1], s + 8);
    transpose8(mn, m);
}

INL void rpk_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QKK;
    const size_t bst = rpk_bstride(type);
    const int ns = rpk_ns(type);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * bst;
        __m256i q[64], s[16], m[8];
        float d[8], dmin[8];
        rpk_unpack8(type, w, ws, 0, nr, b, q, s, m, d, dmin);
        __m256i *ov = (__m256i *)(void *)o;
        for (int i = 0; i < 64; i++) _mm256_store_si256(ov + i, q[i]);
        for (int j = 0; j < ns; j++) /* the scale as the int16 pair (sc, sc) */
            _mm256_store_si256(ov + 64 + j, _mm256_or_si256(
                _mm256_and_si256(s[j], _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s[j], 16)));
        for (int k = 0; k < 8; k++) _mm256_store_si256(ov + 64 + ns + k, m[k]);
        memcpy(o + 2048 + 32 * ns + 256, d, 32);
        memcpy(o + 2048 + 32 * ns + 288, dmin, 32);
    }
}

/* 16-row groups for the AVX512-VNNI K-quant tile (quant_avx512_k.c rpkv16_tile): per
 * super-block, 64 steps of 64 bytes (step s: word s of rows 0..7 in the low 32 bytes, of rows
 * 8..15 in the high 32), then NS scale vectors of 16 int32 (sub-block j's scale per row), 8 min
 * vectors of 16 int16 pairs (row lane (mn_2k, mn_2k+1), as in the 8-row groups), then d[16] and
 * dmin[16] (Q6_K: d again). Rows past nr are zeros. */

INL void rpk16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QKK;
    const size_t bst = cb_rp16_bstride(type);
    const int ns = rpk_ns(type);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * bst;
        float d[16], dmin[16];
        for (int h = 0; h < 2; h++) { /* rows 8h..8h+7: the low / high 32 bytes of each vector */
            __m256i q[64], s[16], m[8];
            rpk_unpack8(type, w, ws, 8 * h, nr, b, q, s, m, d + 8 * h, dmin + 8 * h);
            for (int i = 0; i < 64; i++)
                _mm256_store_si256((__m256i *)(void *)(o + 64 * i + 32 * h), q[i]);
            for (int j = 0; j < ns; j++)
                _mm256_store_si256((__m256i *)(void *)(o + 4096 + 64 * j + 32 * h), s[j]);
            for (int k = 0; k < 8; k++)
                _mm256_store_si256((__m256i *)(void *)(o + 4096 + 64 * ns + 64 * k + 32 * h), m[k]);
        }
        memcpy(o + 4096 + 64 * ns + 512, d, 64);
        memcpy(o + 4096 + 64 * ns + 576, dmin, 64);
    }
}

size_t cb_avx2_k_rp16_group_bytes(int type, int64_t cols) {
    return (size_t)(cols / CB_QKK) * cb_rp16_bstride(type);
}

void cb_avx2_k_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                         uint8_t *dst) {
    switch (type) { /* one instance per type */
    case CB_TYPE_Q4_K: rpk16_pack(CB_TYPE_Q4_K, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_K: rpk16_pack(CB_TYPE_Q5_K, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q6_K: rpk16_pack(CB_TYPE_Q6_K, w, ws, nr, cols, dst); break;
    default: break;
    }
}

INL void rpk_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                  float *out) {
    const int ns = rpk_ns(type), G = rpk_g(type), SB = 64 / ns;
    const size_t bst = rpk_bstride(type);
    __m256 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst, *scv = q + 2048, *mnv = scv + 32 * ns;
        const cb_q8k_t *a[4];
        __m256i isum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            isum[t] = _mm256_setzero_si256();
        }
        #pragma GCC unroll 1
        for (int j = 0; j < ns; j++) {
            const __m256i sc = _mm256_load_si256((const __m256i *)(const void *)(scv + 32 * j));
            #pragma GCC unroll 4
            for (int g0 = 0; g0 < SB; g0 += G) {
                __m256i a16[4];
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) a16[t] = _mm256_setzero_si256();
                #pragma GCC unroll 1
                for (int s = j * SB + g0; s < j * SB + g0 + G; s++) {
                    __m256i wv = _mm256_load_si256((const __m256i *)(const void *)(q + 32 * s));
                    #pragma GCC unroll 4
                    for (int t = 0; t < NT; t++) {
                        __m256i xb = _mm256_set1_epi32(rd_i32((const uint8_t *)a[t]->qs + 4 * s));
                        a16[t] = _mm256_add_epi16(a16[t], _mm256_maddubs_epi16(wv, xb));
                    }
                }
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(a16[t], sc));
            }
        }
        const __m256 dv = _mm256_load_ps((const float *)(const void *)(mnv + 256));
        const __m256 dmv = _mm256_load_ps((const float *)(const void *)(mnv + 288));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i ms = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(
                    _mm256_load_si256((const __m256i *)(const void *)(mnv + 32 * k)),
                    _mm256_set1_epi32(rd_i32((const uint8_t *)a[t]->bsums + 4 * k))));
            const __m256 dx = _mm256_set1_ps(a[t]->d);
            if (type == CB_TYPE_Q6_K) { /* the zero point 32 in the integers, as the tiles */
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], ms)),
                                          _mm256_mul_ps(dv, dx), facc[t]);
                continue;
            }
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dv, dx), facc[t]);
            facc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(ms), _mm256_mul_ps(dmv, dx), facc[t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float tmp[8];
        _mm256_storeu_ps(tmp, facc[t]);
        for (int r = 0; r < 8; r++) out[r * NT + t] = tmp[r];
    }
}

#define CB_DEFINE_RPK(NAME, TYPE)                                                               \
    static void NAME##_pack(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {  \
        rpk_pack(TYPE, w, ws, nr, cols, dst);                                                   \
    }                                                                                           \
    static void NAME##_tile(const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs, int nt, \
                            float *out) {                                                       \
        switch (nt) {                                                                           \
        case 1: rpk_tile(TYPE, 1, pk, nb, xa, xs, out); break;                                  \
        case 2: rpk_tile(TYPE, 2, pk, nb, xa, xs, out); break;                                  \
        case 3: rpk_tile(TYPE, 3, pk, nb, xa, xs, out); break;                                  \
        default: rpk_tile(TYPE, 4, pk, nb, xa, xs, out); break;                                 \
        }                                                                                       \
    }

CB_DEFINE_RPK(rp_q4_k, CB_TYPE_Q4_K)
CB_DEFINE_RPK(rp_q5_k, CB_TYPE_Q5_K)
CB_DEFINE_RPK(rp_q6_k, CB_TYPE_Q6_K)

size_t cb_avx2_k_rp_group_bytes(int type, int64_t cols) {
    return (size_t)(cols / CB_QKK) * rpk_bstride(type);
}

void cb_avx2_k_rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    switch (type) {
    case CB_TYPE_Q4_K: rp_q4_k_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_K: rp_q5_k_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q6_K: rp_q6_k_pack(w, ws, nr, cols, dst); break;
    default: break;
    }
}

void cb_avx2_k_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                       int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_K: rp_q4_k_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_K: rp_q5_k_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q6_K: rp_q6_k_tile(pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

cb_tile_fn cb_avx2_k_tile(int type, int fast) {
    switch (type) {
    case CB_TYPE_Q4_K: return fast ? tile_avx2_fast_q4_k : tile_avx2_q4_k;
    case CB_TYPE_Q5_K: return fast ? tile_avx2_fast_q5_k : tile_avx2_q5_k;
    case CB_TYPE_Q6_K: return fast ? tile_avx2_fast_q6_k : tile_avx2_q6_k;
    default: return NULL;
    }
}

#pragma GCC pop_options
#else
/* Not x86-64 GCC/Clang: no AVX2 kernels; quant_avx2.c's stubs never call here. */
typedef int cb_quant_avx2_k_unused;
#endif
