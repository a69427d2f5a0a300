/* AVX2 (+FMA, F16C) kernels for quant.c: activation quantizers and register-tiled dot products.
 *
 * Compiled for AVX2 with a target pragma whatever the build's -march, and only called when
 * cb_cpu_level() >= CB_SIMD_AVX2. The math is the scalar kernels' (quant.c): same activation
 * rounding (round-to-nearest-even of x*127/max|x|), exact int32 block sums, float scaling per
 * block; only the float summation order differs.
 * Tiles: a kernel computes nr (<= 4) weight rows against nt (<= 4) activation rows; a weight
 * block is unpacked once per row and reused for every token of the tile, and each activation
 * block is loaded once per row from L1.
 *
 * Batch invariance (INV = 1, the default tiles): a tile sums one output element in the packed-row
 * kernels' order, so a token's row is bit-identical whatever path its batch size picks: per
 * block, the block's exact integer sum (zero points out), then acc = fma((float)isum,
 * d_w * d_x, acc) in block order from 0 (Q4_1/Q5_1: then acc = fma(m, s_x, acc); Q4_K/Q5_K:
 * then acc = fnma((float)summ, dmin * d_x, acc)). The tile's (row, token) elements are the
 * lanes of one accumulator; one hadd tree per block reduces all of them (reduce_lanes). Decode
 * (one token; rows32_dec, quant_avx2_k.c's rows_k_dec) reads its rows one after another, so
 * that a task is one sequential stream, and shares the reductions between a row's blocks
 * instead (I4_G128 keeps a 4-row decode tile: INV = 2). INV = 0 (cb_avx2_tile_fast) keeps 8
 * partial sums per element in the lanes and adds them at the end: fewer horizontal sums,
 * another order.
 *
 * Files, per type family: this file holds the activation quantizers, the 32-block types (Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, MXFP4; I4_G128), the float weights, the packed-row entry points and
 * the dispatch (cb_avx2_tile, cb_avx2_tile_fast); quant_avx2_k.c the K-quants (Q4_K, Q5_K,
 * Q6_K: tiles and packed rows), reached through cb_avx2_k_*; quant_avx2_impl.h the always-inline
 * helpers both compile (reductions, prefetch, the 8x8 transpose, the rows-in-pairs dispatch
 * macro), so a kernel's code is the same whichever file it is in.
 */
#include "quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "quant_avx2_impl.h"

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

/* ------------------------------------------------------------ 32-blocks with cb_q8a_t */

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
    default: return 17;
    }
}

INL void tile32(int type, int INV, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const int offset = type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1;
    /* Q4_0/Q5_0: unsigned q times x, minus zero point * sum(x): spread over the 8 lanes of the
     * int32 partial sums that is isum (Q4_0: 8*isum/8) or 2*isum (Q5_0) per lane. */
    const int zp = type == CB_TYPE_Q4_0 ? 1 : (type == CB_TYPE_Q5_0 ? 2 : 0);
    const int unsig = offset || zp;
    const size_t bb = bytes32(type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][4];
    float off[4][4];
    /* INV: lanes k = r * NT + t (see reduce_lanes) */
    __m256 vacc = _mm256_setzero_ps();
    __m256i pv[8];
    float sc[8] = {0}, mk[8] = {0}, sk[8] = {0};
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
        __m256i wq[4], aw[4];
        __m256 dv[4];
        float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            cb_prefetch_l2(w + (size_t)(r + NR * CB_DEC_PF) * ws + (size_t)b * bb);
            wq[r] = unpack32(type, w + (size_t)r * ws + (size_t)b * bb, &dv[r], &m[r]);
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
                if (INV) {
                    pv[r * NT + t] = p;
                    sc[r * NT + t] = _mm256_cvtss_f32(dv[r]) * a->d;
                    if (offset) {
                        mk[r * NT + t] = m[r];
                        sk[r * NT + t] = a->s;
                    }
                } else {
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dv[r], dx),
                                                acc[r][t]);
                    if (offset) off[r][t] += m[r] * a->s;
                }
            }
        }
        if (INV) {
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(pv, NR * NT)), set8(sc), vacc);
            if (offset) vacc = _mm256_fmadd_ps(set8(mk), set8(sk), vacc);
        }
    }
    if (INV) {
        store_lanes(vacc, NR, NT, out, out_nt, r_off);
        return;
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]) + off[r][t];
}

/* Decode (one token), batch-invariant, of the 32-value block types: nr (<= 8) rows one after
 * the other, so that a task reads one sequential stream (the hardware prefetcher follows it;
 * rows read side by side are short streams it keeps restarting on), CB_DEC_PF_BYTES ahead
 * prefetched. First every row's exact block sums (8 blocks share a reduction) and scales into
 * a chunk buffer, then the float chain with lanes = rows, in block order: acc = fma(isum,
 * d * dx, acc) (Q4_1/Q5_1: then acc = fma(m, s_x, acc)), as tile32's INV lanes. */
#define ROWS32_CHUNK 64
INL void rows32_dec(int type, int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                    float *out) {
    const int offset = type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1;
    const int zp = type == CB_TYPE_Q4_0 ? 1 : (type == CB_TYPE_Q5_0 ? 2 : 0);
    const int unsig = offset || zp;
    const size_t bb = bytes32(type);
    const __m256i ones = _mm256_set1_epi16(1);
    const cb_q8a_t *xa = (const cb_q8a_t *)(const void *)x;
    int32_t isb[8][ROWS32_CHUNK] __attribute__((aligned(32)));
    /* per block and row: the scale (f16 bits; MXFP4: as a float) and the offset m */
    uint16_t dh[ROWS32_CHUNK][8] __attribute__((aligned(16)));
    float db[ROWS32_CHUNK][8] __attribute__((aligned(32))), mb[ROWS32_CHUNK][8] __attribute__((aligned(32)));
    __m256 vacc = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nb; c0 += ROWS32_CHUNK) {
        const int cn = nb - c0 < ROWS32_CHUNK ? (int)(nb - c0) : ROWS32_CHUNK;
        for (int r = 0; r < 8; r++) {
            if (r >= nr) { /* lanes of absent rows: zeros */
                memset(isb[r], 0, sizeof isb[r]);
                for (int b = 0; b < cn; b++) {
                    db[b][r] = mb[b][r] = 0.0f;
                    dh[b][r] = 0;
                }
                continue;
            }
            const uint8_t *row = w + (size_t)r * ws + (size_t)c0 * bb;
            for (int b0 = 0; b0 < cn; b0 += 8) {
                __m256i pv[8];
                #pragma GCC unroll 8
                for (int k = 0; k < 8; k++) {
                    if (b0 + k >= cn) {
                        pv[k] = _mm256_setzero_si256();
                        continue;
                    }
                    const uint8_t *blk = row + (size_t)(b0 + k) * bb;
                    const cb_q8a_t *a = xa + c0 + b0 + k;
                    cb_prefetch_l1(blk + CB_DEC_PF_BYTES);
                    __m256 dv;
                    float m = 0.0f;
                    __m256i wq = unpack32(type, blk, &dv, &m);
                    __m256i aw = unsig ? wq : _mm256_sign_epi8(wq, wq);
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)a->qs);
                    if (!unsig) xv = _mm256_sign_epi8(xv, wq);
                    pv[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones);
                    if (type == CB_TYPE_MXFP4)
                        db[b0 + k][r] = _mm256_cvtss_f32(dv);
                    else
                        dh[b0 + k][r] = cb_rd16(blk);
                    if (offset) mb[b0 + k][r] = m;
                }
                _mm256_store_si256((__m256i *)(void *)&isb[r][b0], reduce_lanes(pv, 8));
            }
        }
        for (int b0 = 0; b0 < cn; b0 += 8) {
            __m256i rows8[8], t[8];
            #pragma GCC unroll 8
            for (int r = 0; r < 8; r++) rows8[r] = _mm256_load_si256((const __m256i *)(const void *)&isb[r][b0]);
            transpose8(rows8, t);
            const int kn = cn - b0 < 8 ? cn - b0 : 8;
            for (int k = 0; k < kn; k++) {
                const cb_q8a_t *a = xa + c0 + b0 + k;
                const __m256 dw = type == CB_TYPE_MXFP4
                    ? _mm256_load_ps(db[b0 + k])
                    : _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)dh[b0 + k]));
                const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a->d));
                /* the zero point out: z * sum(x), exactly (Q4_0: 8, Q5_0: 16) */
                if (zp) t[k] = _mm256_sub_epi32(t[k], _mm256_set1_epi32(a->isum * 8 * zp));
                vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t[k]), sc, vacc);
                if (offset) vacc = _mm256_fmadd_ps(_mm256_load_ps(mb[b0 + k]), _mm256_set1_ps(a->s), vacc);
            }
        }
    }
    float o[8];
    _mm256_storeu_ps(o, vacc);
    for (int r = 0; r < nr; r++) out[r] = o[r];
}

/* ------------------------------------------------------------ packed rows (matmul, 32-blocks)
 *
 * For a batch of tokens the 32-block types (Q4_0 ... MXFP4, I4_G128) run on weight rows that
 * are first unpacked, 8 rows at a time, into a "lanes = rows" layout (cb_avx2_rp_pack): per
 * block of 32 values, 8 vectors s = 0..7, vector s holding values 4s..4s+3 of rows 0..7 (4 bytes
 * per row), then the 8 rows' scales d (float[8]) and, for Q4_1/Q5_1, offsets m (float[8]).
 * Values are kept unsigned (q with its zero point z: 8 for Q4_0/I4_G128, 16 for Q5_0, 12 for
 * MXFP4 stored as K+12) except Q8_0 (signed). A token's 4 activation bytes broadcast to all 8
 * lanes, one _mm256_maddubs_epi16 then multiplies 8 rows x 4 values, and the int16 pair sums
 * accumulate over G steps before one _mm256_madd_epi16 widens them (G is the largest count that
 * cannot overflow int16: G*2*qmax*127 <= 32767). The zero point comes out as z*sum(x) per
 * block, exactly; only then is the block scaled in float: lanes are rows, so one FMA serves 8
 * rows. Each packed vector is reused by 4 tokens from registers, each activation broadcast by 8
 * rows. Q8_0 (signed weights) uses |w| and sign(x, w) with G = 1.
 * Activations (cb_avx2_rp_quantize): per token qs[cols] (int8, the same rounding as cb_q8a_t),
 * then float d[nb], int32 z*isum[nb] (z = cb_rp_act_z(type): for Q8_0 128, which only the
 * AVX512-VNNI tile reads), float s[nb] = d*isum. */

INL int rp_z(int type) {
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_I4_G128: return 8;
    case CB_TYPE_Q5_0: return 16;
    case CB_TYPE_MXFP4: return 12;
    default: return 0;
    }
}

INL int rp_has_m(int type) { return type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1; }

INL int rp_steps(int type) { /* int16 steps per madd, see above */
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_I4_G128: return 8; /* 8*2*15*127 = 30480 */
    case CB_TYPE_Q8_0: return 1;
    default: return 4; /* Q5 (31), MXFP4 (24): 4*2*31*127 = 31496 */
    }
}

INL size_t rp_bstride(int type) { return 256 + 32 + (rp_has_m(type) ? 32 : 0); }

int cb_avx2_rp_supported(int type) {
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_Q5_0:
    case CB_TYPE_Q5_1:
    case CB_TYPE_Q8_0:
    case CB_TYPE_MXFP4:
    case CB_TYPE_I4_G128:
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return 1;
    default: return 0;
    }
}

size_t cb_avx2_rp_act_stride(int64_t cols) {
    size_t b = (size_t)cols + 12 * (size_t)(cols / CB_QK);
    return (b + 63) / 64 * 64;
}

size_t cb_avx2_rp_group_bytes(int type, int64_t cols) {
    if (type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K || type == CB_TYPE_Q6_K)
        return cb_avx2_k_rp_group_bytes(type, cols);
    return (size_t)(cols / CB_QK) * rp_bstride(type);
}

void cb_avx2_rp_quantize(int type, const float *x, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const int z = cb_rp_act_z(type);
    float *dx = (float *)(void *)(dst + cols);
    int32_t *zi = (int32_t *)(void *)(dx + nb);
    float *sx = (float *)(void *)(zi + nb);
    for (int64_t b = 0; b < nb; b++) {
        const float *v = x + b * CB_QK;
        float amax = amax_n(v, CB_QK);
        float d = amax / 127.0f;
        __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        int s0, s1;
        _mm256_storeu_si256((__m256i *)(void *)(dst + 32 * b), quant32(v, id, &s0, &s1));
        dx[b] = d;
        zi[b] = z * (s0 + s1);
        sx[b] = d * (float)(s0 + s1);
    }
}

/* one block of one row as 32 bytes (unsigned q, or signed for Q8_0) and its scale / offset */
INL __m256i rp_unpack(int type, const uint8_t *row, int64_t b, float *d, float *m) {
    switch (type) {
    case CB_TYPE_Q4_0: {
        const uint8_t *p = row + b * 18;
        *d = f16(p);
        return nibbles(p + 2);
    }
    case CB_TYPE_Q4_1: {
        const uint8_t *p = row + b * 20;
        *d = f16(p);
        *m = f16(p + 2);
        return nibbles(p + 4);
    }
    case CB_TYPE_Q5_0: {
        const uint8_t *p = row + b * 22;
        *d = f16(p);
        return _mm256_or_si256(nibbles(p + 6), fifth_bits(p + 2));
    }
    case CB_TYPE_Q5_1: {
        const uint8_t *p = row + b * 24;
        *d = f16(p);
        *m = f16(p + 2);
        return _mm256_or_si256(nibbles(p + 8), fifth_bits(p + 4));
    }
    case CB_TYPE_Q8_0: {
        const uint8_t *p = row + b * 34;
        *d = f16(p);
        return _mm256_loadu_si256((const __m256i *)(const void *)(p + 2));
    }
    case CB_TYPE_I4_G128: {
        const uint8_t *p = row + (b >> 2) * 66;
        *d = f16(p);
        return nibbles_interleaved(p + 2 + 16 * (b & 3));
    }
    default: { /* MXFP4: K + 12 */
        const uint8_t *p = row + b * 17;
        *d = cb_e8m0_half(p[0]);
        const __m256i table = _mm256_broadcastsi128_si256(_mm_add_epi8(
            _mm_loadu_si128((const __m128i *)(const void *)cb_mxfp4_values), _mm_set1_epi8(12)));
        return _mm256_shuffle_epi8(table, nibbles(p + 1));
    }
    }
}

INL void rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const size_t bst = rp_bstride(type);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * bst;
        __m256i v[8];
        float d[8], m[8];
        #pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            d[r] = 0.0f;
            m[r] = 0.0f;
            v[r] = r < nr ? rp_unpack(type, w + (size_t)r * ws, b, &d[r], &m[r])
                          : _mm256_setzero_si256();
        }
        transpose_store8(v, o); /* o: 32-bit word s of rows 0..7 at 32*s */
        memcpy(o + 256, d, 32);
        if (rp_has_m(type)) memcpy(o + 288, m, 32);
    }
}

/* 16-row groups for the AVX512-VNNI packed tile (quant_avx512.c rpv16_tile): per block of 32
 * values, 8 vectors of 64 bytes (step s: word s of rows 0..7 in the low 32 bytes, of rows 8..15
 * in the high 32), then d[16] (float) and, for Q4_1/Q5_1, m[16]. Values as in the 8-row groups,
 * but Q8_0's as w + 128 (unsigned, what vpdpbusd multiplies; the activations' z*isum with z = 128
 * takes the 128*sum(x) out again). Rows past nr are zeros with d = 0. */

size_t cb_avx2_rp16_group_bytes(int type, int64_t cols) {
    if (type == CB_TYPE_Q4_K || type == CB_TYPE_Q5_K || type == CB_TYPE_Q6_K)
        return cb_avx2_k_rp16_group_bytes(type, cols);
    return (size_t)(cols / CB_QK) * cb_rp16_bstride(type);
}

INL void rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const size_t bst = cb_rp16_bstride(type);
    const __m256i flip = _mm256_set1_epi8(type == CB_TYPE_Q8_0 ? (char)0x80 : 0);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * bst;
        float d[16], m[16];
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i v[8], t[8];
            #pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const int row = 8 * h + r;
                d[row] = 0.0f;
                m[row] = 0.0f;
                v[r] = row < nr ? rp_unpack(type, w + (size_t)row * ws, b, &d[row], &m[row])
                                : _mm256_setzero_si256();
            }
            transpose8(v, t);
            #pragma GCC unroll 8
            for (int s = 0; s < 8; s++)
                _mm256_store_si256((__m256i *)(void *)(o + 64 * s + 32 * h),
                                   _mm256_xor_si256(t[s], flip));
        }
        memcpy(o + 512, d, 64);
        if (rp_has_m(type)) memcpy(o + 576, m, 64);
    }
}

void cb_avx2_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    switch (type) { /* one instance per type: rp_unpack's switch folds away */
    case CB_TYPE_Q4_0: rp16_pack(CB_TYPE_Q4_0, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_1: rp16_pack(CB_TYPE_Q4_1, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_0: rp16_pack(CB_TYPE_Q5_0, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_1: rp16_pack(CB_TYPE_Q5_1, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q8_0: rp16_pack(CB_TYPE_Q8_0, w, ws, nr, cols, dst); break;
    case CB_TYPE_MXFP4: rp16_pack(CB_TYPE_MXFP4, w, ws, nr, cols, dst); break;
    case CB_TYPE_I4_G128: rp16_pack(CB_TYPE_I4_G128, w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: cb_avx2_k_rp16_pack(type, w, ws, nr, cols, dst); break;
    default: break;
    }
}

INL void rp_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                 float *out) {
    const int G = rp_steps(type), z = rp_z(type), hm = rp_has_m(type);
    const int sgn = type == CB_TYPE_Q8_0;
    const size_t bst = rp_bstride(type);
    const int64_t cols = nb * CB_QK;
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t *xq[4];
    const float *dx[4], *sx[4];
    const int32_t *zi[4];
    __m256 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        xq[t] = xa + (size_t)t * xs;
        dx[t] = (const float *)(const void *)(xq[t] + cols);
        zi[t] = (const int32_t *)(const void *)(dx[t] + nb);
        sx[t] = (const float *)(const void *)(zi[t] + nb);
        facc[t] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst;
        __m256i iacc[4];
        #pragma GCC unroll 8
        for (int g0 = 0; g0 < 8; g0 += G) {
            __m256i a16[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) a16[t] = _mm256_setzero_si256();
            /* not unrolled: unrolled, GCC hoists every step's products and spills them */
            #pragma GCC unroll 1
            for (int s = g0; s < g0 + G; s++) {
                __m256i wv = _mm256_load_si256((const __m256i *)(const void *)(q + 32 * s));
                __m256i aw = sgn ? _mm256_abs_epi8(wv) : wv;
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m256i xb = _mm256_set1_epi32(rd_i32(xq[t] + 32 * b + 4 * s));
                    if (sgn) xb = _mm256_sign_epi8(xb, wv);
                    a16[t] = _mm256_add_epi16(a16[t], _mm256_maddubs_epi16(aw, xb));
                }
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m256i p = _mm256_madd_epi16(a16[t], ones);
                iacc[t] = g0 == 0 ? p : _mm256_add_epi32(iacc[t], p);
            }
        }
        const __m256 dv = _mm256_load_ps((const float *)(const void *)(q + 256));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i p = z ? _mm256_sub_epi32(iacc[t], _mm256_set1_epi32(zi[t][b])) : iacc[t];
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                      _mm256_mul_ps(dv, _mm256_set1_ps(dx[t][b])), facc[t]);
            if (hm)
                facc[t] = _mm256_fmadd_ps(_mm256_load_ps((const float *)(const void *)(q + 288)),
                                          _mm256_set1_ps(sx[t][b]), facc[t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float tmp[8];
        _mm256_storeu_ps(tmp, facc[t]);
        for (int r = 0; r < 8; r++) out[r * NT + t] = tmp[r];
    }
}

#define CB_DEFINE_RP(NAME, TYPE)                                                                \
    static void NAME##_pack(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {  \
        rp_pack(TYPE, w, ws, nr, cols, dst);                                                    \
    }                                                                                           \
    static void NAME##_tile(const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs, int nt, \
                            float *out) {                                                       \
        switch (nt) {                                                                           \
        case 1: rp_tile(TYPE, 1, pk, nb, xa, xs, out); break;                                   \
        case 2: rp_tile(TYPE, 2, pk, nb, xa, xs, out); break;                                   \
        case 3: rp_tile(TYPE, 3, pk, nb, xa, xs, out); break;                                   \
        default: rp_tile(TYPE, 4, pk, nb, xa, xs, out); break;                                  \
        }                                                                                       \
    }

CB_DEFINE_RP(rp_q4_0, CB_TYPE_Q4_0)
CB_DEFINE_RP(rp_q4_1, CB_TYPE_Q4_1)
CB_DEFINE_RP(rp_q5_0, CB_TYPE_Q5_0)
CB_DEFINE_RP(rp_q5_1, CB_TYPE_Q5_1)
CB_DEFINE_RP(rp_q8_0, CB_TYPE_Q8_0)
CB_DEFINE_RP(rp_mxfp4, CB_TYPE_MXFP4)
CB_DEFINE_RP(rp_i4g128, CB_TYPE_I4_G128)

void cb_avx2_rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    switch (type) {
    case CB_TYPE_Q4_0: rp_q4_0_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_1: rp_q4_1_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_0: rp_q5_0_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_1: rp_q5_1_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q8_0: rp_q8_0_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_MXFP4: rp_mxfp4_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_I4_G128: rp_i4g128_pack(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: cb_avx2_k_rp_pack(type, w, ws, nr, cols, dst); break;
    default: break;
    }
}

void cb_avx2_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                     int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_0: rp_q4_0_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_1: rp_q4_1_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_0: rp_q5_0_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_1: rp_q5_1_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q8_0: rp_q8_0_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_MXFP4: rp_mxfp4_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_I4_G128: rp_i4g128_tile(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: cb_avx2_k_rp_tile(type, pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

/* I4_G128 against cb_q8a_t: a half group (32 bytes) unpacks to activation blocks b, b+1. */
INL void tile_i4(int unused, int INV, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                 const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)unused;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[4][4];
    __m256 vacc = _mm256_setzero_ps(); /* INV: lanes k = r * NT + t */
    __m256i pv0[8], pv1[8];
    float sc0[8] = {0}, sc1[8] = {0};
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        __m256i w0[4], w1[4];
        __m256 dv[4];
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)(b >> 2) * 66;
            if ((b & 3) == 0) prefetch_span(blk + (size_t)NR * CB_DEC_PF * ws, 66);
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(blk + 2 + 16 * (b & 3)));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            __m256i a = _mm256_unpacklo_epi8(lo, hi), c = _mm256_unpackhi_epi8(lo, hi);
            w0[r] = _mm256_permute2x128_si256(a, c, 0x20);
            w1[r] = _mm256_permute2x128_si256(a, c, 0x31);
            dv[r] = f16x8(blk);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)a[0].qs);
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)a[1].qs);
            const __m256i z0 = _mm256_set1_epi32(a[0].isum), z1 = _mm256_set1_epi32(a[1].isum);
            const __m256 d0 = _mm256_broadcast_ss(&a[0].d), d1 = _mm256_broadcast_ss(&a[1].d);
            #pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                /* unsigned q times x, minus 8*isum spread over the 8 lanes */
                __m256i p0 = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w0[r], x0), ones), z0);
                __m256i p1 = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w1[r], x1), ones), z1);
                if (INV) {
                    const float dw = _mm256_cvtss_f32(dv[r]);
                    pv0[r * NT + t] = p0;
                    pv1[r * NT + t] = p1;
                    sc0[r * NT + t] = dw * a[0].d;
                    sc1[r * NT + t] = dw * a[1].d;
                } else {
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(dv[r], d0), acc[r][t]);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(dv[r], d1), acc[r][t]);
                }
            }
        }
        if (INV) {
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(pv0, NR * NT)), set8(sc0), vacc);
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce_lanes(pv1, NR * NT)), set8(sc1), vacc);
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

INL void tile_float(int type, int INV, int NR, int NT, int64_t n, const uint8_t *w, size_t ws,
                    const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)INV; /* a float row's sum does not depend on NR/NT: invariant either way */
    const size_t es = type == CB_TYPE_F32 ? 4 : 2;
    __m256 acc[4][4];
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
/* CB_DEFINE_TILE (quant_avx2_impl.h) makes a cb_tile_fn of a tile body; the K-quants' are in
 * quant_avx2_k.c. */

CB_DEFINE_TILE_DEC(tile_avx2_q4_0, tile32, CB_TYPE_Q4_0, rows32_dec)
CB_DEFINE_TILE_DEC(tile_avx2_q4_1, tile32, CB_TYPE_Q4_1, rows32_dec)
CB_DEFINE_TILE_DEC(tile_avx2_q5_0, tile32, CB_TYPE_Q5_0, rows32_dec)
CB_DEFINE_TILE_DEC(tile_avx2_q5_1, tile32, CB_TYPE_Q5_1, rows32_dec)
CB_DEFINE_TILE_DEC(tile_avx2_q8_0, tile32, CB_TYPE_Q8_0, rows32_dec)
CB_DEFINE_TILE_DEC(tile_avx2_mxfp4, tile32, CB_TYPE_MXFP4, rows32_dec)
CB_DEFINE_TILE(tile_avx2_i4g128, tile_i4, 0, 2)
CB_DEFINE_TILE(tile_avx2_f32, tile_float, CB_TYPE_F32, 1)
CB_DEFINE_TILE(tile_avx2_f16, tile_float, CB_TYPE_F16, 1)
CB_DEFINE_TILE(tile_avx2_bf16, tile_float, CB_TYPE_BF16, 1)
CB_DEFINE_TILE(tile_avx2_fast_q4_0, tile32, CB_TYPE_Q4_0, 0)
CB_DEFINE_TILE(tile_avx2_fast_q4_1, tile32, CB_TYPE_Q4_1, 0)
CB_DEFINE_TILE(tile_avx2_fast_q5_0, tile32, CB_TYPE_Q5_0, 0)
CB_DEFINE_TILE(tile_avx2_fast_q5_1, tile32, CB_TYPE_Q5_1, 0)
CB_DEFINE_TILE(tile_avx2_fast_q8_0, tile32, CB_TYPE_Q8_0, 0)
CB_DEFINE_TILE(tile_avx2_fast_mxfp4, tile32, CB_TYPE_MXFP4, 0)
CB_DEFINE_TILE(tile_avx2_fast_i4g128, tile_i4, 0, 0)

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
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return cb_avx2_k_tile(type, 0);
    default: return cb_avx2_lowbit_tile(type); /* quant_avx2_lowbit.c: invariant either way */
    }
}

/* The tiles of the non-invariant mode (deterministic=False): lanes hold partial sums. */
cb_tile_fn cb_avx2_tile_fast(int type) {
    switch (type) {
    case CB_TYPE_F32: return tile_avx2_f32;
    case CB_TYPE_F16: return tile_avx2_f16;
    case CB_TYPE_BF16: return tile_avx2_bf16;
    case CB_TYPE_Q4_0: return tile_avx2_fast_q4_0;
    case CB_TYPE_Q4_1: return tile_avx2_fast_q4_1;
    case CB_TYPE_Q5_0: return tile_avx2_fast_q5_0;
    case CB_TYPE_Q5_1: return tile_avx2_fast_q5_1;
    case CB_TYPE_Q8_0: return tile_avx2_fast_q8_0;
    case CB_TYPE_MXFP4: return tile_avx2_fast_mxfp4;
    case CB_TYPE_I4_G128: return tile_avx2_fast_i4g128;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return cb_avx2_k_tile(type, 1);
    default: return cb_avx2_lowbit_tile(type);
    }
}

#pragma GCC pop_options
#else
/* Not x86-64 GCC/Clang: no AVX2 kernels (cb_cpu_level() is scalar there). */
cb_tile_fn cb_avx2_tile(int type) {
    (void)type;
    return NULL;
}
cb_tile_fn cb_avx2_tile_fast(int type) {
    (void)type;
    return NULL;
}
void cb_avx2_quantize_q8a(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
void cb_avx2_quantize_q8k(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
int cb_avx2_rp_supported(int type) {
    (void)type;
    return 0;
}
size_t cb_avx2_rp_act_stride(int64_t cols) { return (size_t)cols; }
size_t cb_avx2_rp_group_bytes(int type, int64_t cols) {
    (void)type;
    return (size_t)cols;
}
void cb_avx2_rp_quantize(int type, const float *x, int64_t cols, uint8_t *dst) {
    (void)type; (void)x; (void)cols; (void)dst;
}
void cb_avx2_rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    (void)type; (void)w; (void)ws; (void)nr; (void)cols; (void)dst;
}
void cb_avx2_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                     int nt, float *out) {
    (void)type; (void)pk; (void)nb; (void)xa; (void)xs; (void)nt; (void)out;
}
size_t cb_avx2_rp16_group_bytes(int type, int64_t cols) {
    (void)type;
    return (size_t)cols;
}
void cb_avx2_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    (void)type; (void)w; (void)ws; (void)nr; (void)cols; (void)dst;
}
#endif
