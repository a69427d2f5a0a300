/* AVX2 direct tiles of every low-bit type: Q2_K, Q3_K, Q8_K, TQ1_0, TQ2_0, IQ1_S, IQ1_M, IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_XS (super-blocks of 256 values, activations cb_q8k_t) and
 * IQ4_NL (blocks of 32, cb_q8a_t), for quant.c through cb_avx2_lowbit_tile (quant_avx2.c's
 * dispatch asks here for the types it does not hold). The scalar kernels (quant_lowbit.c,
 * quant_iq.c) define the math.
 *
 * Tile: rows r < nr, tokens t < nt (cb_tile_fn). A row's super-block is decoded once into
 * registers (8 vectors of 32 weight integers and its integer sub-block scales) and then meets
 * every token of the tile: per token the exact int32 sum of the block (vpmaddubsw on the
 * unsigned or |w| weight bytes against the activation bytes, vpmaddwd with the sub-block
 * scales), then the float scale in the scalar kernel's operations and order (acc += (d*dx) *
 * (float)isum, for Q2_K acc -= (dmin*dx) * (float)msum; no FMA contraction under -std=c11).
 * The integer sums are exact and equal to the scalar kernel's, so the results are the scalar
 * kernels' bit for bit, whatever nr and nt: batch invariant by construction, and the same at
 * every SIMD level (AVX-512 CPUs run these tiles too: there are no AVX-512 or packed-row
 * kernels of these types yet, and the fast mode runs them as well).
 *
 * Weight bytes: unsigned (Q2_K q, Q3_K q + 4, TQ digits q + 1: the caller takes 4 or 1 times the
 * activation's bsums back out), unsigned grid values with sign bits applied to x (IQ2, IQ3), or
 * signed (IQ4 values, IQ1's 8g +- 1, Q8_K: |w| against sign(x, w)). No int16 saturation: the
 * vpmaddubsw pairs reach 2*7*127 (Q3_K), 2*43*127 (IQ2), 2*62*127 (IQ3), 2*127*127 (IQ4), and
 * 2*128*127 = 32512 (Q8_K's -128).
 * Compiled for AVX2 with a target pragma whatever the build's -march, and only called when
 * cb_cpu_level() >= CB_SIMD_AVX2. Every pointer is borrowed for one call.
 */
#include "quant_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "quant_avx2_impl.h"
#include "quant_iq_tables.h"

/* A decoded super-block: 8 vectors of 32 weight bytes (values 32v..32v+31), per vector the
 * int16 scale vector for vpmaddwd (low lane: values 32v..32v+15, high lane: the next 16), and
 * the per-type extras. */
typedef struct {
    __m256i w[8], sc[8];
    __m256i sgn[8];      /* IQ2, IQ3: the signs of the 32 values as bytes -1 / +1 */
    __m256i mins;        /* the bsums factors: Q2_K's 16 mins, Q3_K's 16 scales, TQ's ones */
    float d, dmin;
} lb_block;

INL __m256i lanes16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

/* 32 bytes: byte k = -1 where bit k%8 of byte k/8 of the 32-bit word s is set, else +1 */
INL __m256i expand_signs(uint32_t s) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), shuf);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits), _mm256_set1_epi8(1));
}

/* the same from four 7-bit ksigns indices (cb_iq_signs64: the 8 signs of an index as bytes) */
INL __m256i ksigns_vec(uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_setr_epi64x((long long)cb_iq_signs64[i0], (long long)cb_iq_signs64[i1],
                              (long long)cb_iq_signs64[i2], (long long)cb_iq_signs64[i3]);
}

/* the signs of a 32-value group from 4 x 7 sign bits */
INL __m256i ksigns4(uint32_t aux) {
    return ksigns_vec(aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127);
}

/* ------------------------------------------------------------ decoders */

/* 16 sub-block scales as words S -> k->sc[v] = [S[2v] x 8 | S[2v+1] x 8] */
INL void scales16(__m256i S, lb_block *k) {
    const __m256i lo = _mm256_permute4x64_epi64(S, 0x44), hi = _mm256_permute4x64_epi64(S, 0xEE);
    for (int v = 0; v < 8; v++) {
        const int j = 2 * (v & 3);
        const __m256i ctl = _mm256_setr_epi8((char)(2 * j), (char)(2 * j + 1), (char)(2 * j), (char)(2 * j + 1),
            (char)(2 * j), (char)(2 * j + 1), (char)(2 * j), (char)(2 * j + 1), (char)(2 * j), (char)(2 * j + 1),
            (char)(2 * j), (char)(2 * j + 1), (char)(2 * j), (char)(2 * j + 1), (char)(2 * j), (char)(2 * j + 1),
            (char)(2 * j + 2), (char)(2 * j + 3), (char)(2 * j + 2), (char)(2 * j + 3), (char)(2 * j + 2),
            (char)(2 * j + 3), (char)(2 * j + 2), (char)(2 * j + 3), (char)(2 * j + 2), (char)(2 * j + 3),
            (char)(2 * j + 2), (char)(2 * j + 3), (char)(2 * j + 2), (char)(2 * j + 3), (char)(2 * j + 2),
            (char)(2 * j + 3));
        k->sc[v] = _mm256_shuffle_epi8(v < 4 ? lo : hi, ctl);
    }
}

INL void dec_q2_k(const uint8_t *b, lb_block *k) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16 + 32 * h));
        for (int s = 0; s < 4; s++) k->w[4 * h + s] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
    }
    const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)b), m4 = _mm_set1_epi8(0x0F);
    scales16(_mm256_cvtepu8_epi16(_mm_and_si128(sc, m4)), k);
    k->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    k->d = f16(b + 80);
    k->dmin = f16(b + 82);
}

INL void dec_q3_k(const uint8_t *b, lb_block *k) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b);
    /* the 6-bit scales: low nibbles of bytes 0..7 (j < 8), then their high nibbles; high 2
     * bits from bytes 8..11 >> 2*(j/4) */
    const uint8_t *s = b + 96;
    uint64_t s8;
    memcpy(&s8, s, 8);
    const __m128i v8 = _mm_cvtsi64_si128((long long)s8), m4 = _mm_set1_epi8(0x0F);
    const __m128i slo = _mm_unpacklo_epi64(_mm_and_si128(v8, m4), _mm_and_si128(_mm_srli_epi16(v8, 4), m4));
    const __m128i shi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)cb_rd32(s + 8)), _mm_setr_epi32(0, 2, 4, 6)),
                                      _mm_set1_epi8(3));
    const __m256i S = _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(slo, _mm_slli_epi16(shi, 4)), _mm_set1_epi8(32)));
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32 + 32 * h));
        for (int t = 0; t < 4; t++) {
            int v = 4 * h + t;
            const __m256i bit = _mm256_set1_epi8((char)(1 << v));
            __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
            k->w[v] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * t), m3), hi);
        }
    }
    scales16(S, k);
    k->mins = S;
    k->d = f16(b + 108);
}

INL void dec_iq2_xxs(const uint8_t *b, lb_block *k) {
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *g = b + 2 + 8 * ib;
        uint32_t aux1 = cb_rd32(g + 4);
        k->w[ib] = _mm256_setr_epi64x((long long)cb_iq2xxs_grid[g[0]], (long long)cb_iq2xxs_grid[g[1]],
                                      (long long)cb_iq2xxs_grid[g[2]], (long long)cb_iq2xxs_grid[g[3]]);
        k->sgn[ib] = ksigns4(aux1);
        k->sc[ib] = _mm256_set1_epi16((short)(2 * (int)(aux1 >> 28) + 1));
    }
    k->d = f16(b);
}

INL void dec_iq3_xxs(const uint8_t *b, lb_block *k) {
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *q = b + 2 + 8 * ib;
        uint32_t aux = cb_rd32(b + 66 + 4 * ib);
        k->w[ib] = _mm256_setr_epi32((int)cb_iq3xxs_grid[q[0]], (int)cb_iq3xxs_grid[q[1]],
                                     (int)cb_iq3xxs_grid[q[2]], (int)cb_iq3xxs_grid[q[3]],
                                     (int)cb_iq3xxs_grid[q[4]], (int)cb_iq3xxs_grid[q[5]],
                                     (int)cb_iq3xxs_grid[q[6]], (int)cb_iq3xxs_grid[q[7]]);
        k->sgn[ib] = ksigns4(aux);
        k->sc[ib] = _mm256_set1_epi16((short)(2 * (int)(aux >> 28) + 1));
    }
    k->d = f16(b);
}

/* IQ4: 16 bytes of nibbles -> 32 signed values (low nibbles first), through the 16 values */
INL __m256i iq4_values(const uint8_t *qs) {
    const __m128i kv = _mm_loadu_si128((const __m128i *)(const void *)cb_iq4nl_values);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m128i q = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i lo = _mm_shuffle_epi8(kv, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(kv, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    return _mm256_set_m128i(hi, lo);
}

INL void dec_iq4_xs(const uint8_t *b, lb_block *k) {
    /* the 8 6-bit scales as dwords, both words of a dword the scale */
    const __m128i x = _mm_cvtsi32_si128((int)cb_rd32(b + 4)), m4 = _mm_set1_epi8(0x0F);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4)));
    const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(cb_rd16(b + 2)),
                                                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                        _mm256_set1_epi32(3));
    const __m256i s32 = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(s32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s32, 16));
    for (int ib = 0; ib < 8; ib++) {
        k->w[ib] = iq4_values(b + 8 + 16 * ib);
        k->sc[ib] = _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(ib));
    }
    k->d = f16(b);
}

INL void iq2x_scales(const uint8_t *sc, lb_block *k) { /* IQ2_XS / IQ2_S: 2*nibble + 1 per 16 */
    for (int v = 0; v < 8; v++)
        k->sc[v] = lanes16(2 * (sc[v] & 0x0F) + 1, 2 * (sc[v] >> 4) + 1);
}

INL void dec_iq2_xs(const uint8_t *b, lb_block *k) {
    for (int v = 0; v < 8; v++) {
        uint16_t q[4];
        memcpy(q, b + 2 + 8 * v, 8);
        k->w[v] = _mm256_setr_epi64x((long long)cb_iq2xs_grid[q[0] & 511], (long long)cb_iq2xs_grid[q[1] & 511],
                                     (long long)cb_iq2xs_grid[q[2] & 511], (long long)cb_iq2xs_grid[q[3] & 511]);
        k->sgn[v] = ksigns_vec(q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9);
    }
    iq2x_scales(b + 66, k);
    k->d = f16(b);
}

INL void dec_iq2_s(const uint8_t *b, lb_block *k) {
    for (int v = 0; v < 8; v++) {
        const uint8_t *qs = b + 2 + 4 * v;
        unsigned h = b[66 + v];
        k->w[v] = _mm256_setr_epi64x((long long)cb_iq2s_grid[qs[0] | (h & 3u) << 8],
                                     (long long)cb_iq2s_grid[qs[1] | (h >> 2 & 3u) << 8],
                                     (long long)cb_iq2s_grid[qs[2] | (h >> 4 & 3u) << 8],
                                     (long long)cb_iq2s_grid[qs[3] | (h >> 6 & 3u) << 8]);
        k->sgn[v] = expand_signs(cb_rd32(b + 34 + 4 * v));
    }
    iq2x_scales(b + 74, k);
    k->d = f16(b);
}

INL void dec_iq3_s(const uint8_t *b, lb_block *k) {
    for (int v = 0; v < 8; v++) {
        const uint8_t *qs = b + 2 + 8 * v;
        unsigned h = b[66 + v];
        uint32_t e[8];
        for (int i = 0; i < 8; i++) e[i] = cb_iq3s_grid[qs[i] | (h >> i & 1u) << 8];
        k->w[v] = _mm256_loadu_si256((const __m256i *)(const void *)e);
        k->sgn[v] = expand_signs(cb_rd32(b + 74 + 4 * v));
        k->sc[v] = _mm256_set1_epi16((short)(1 + 2 * ((b[106 + v / 2] >> (4 * (v & 1))) & 0x0F)));
    }
    k->d = f16(b);
}

/* IQ1: 8g + delta (+-1) as signed bytes from 4 grid entries (bytes -1, 0, 1) and 4 delta signs */
INL __m256i iq1_values(const uint64_t e[4], const int neg[4]) {
    const __m256i g = _mm256_setr_epi64x((long long)e[0], (long long)e[1], (long long)e[2], (long long)e[3]);
    const __m256i g8 = _mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8((char)0xF8));
    const __m256i ds = _mm256_setr_epi64x(neg[0] ? -1LL : 0x0101010101010101LL, neg[1] ? -1LL : 0x0101010101010101LL,
                                          neg[2] ? -1LL : 0x0101010101010101LL, neg[3] ? -1LL : 0x0101010101010101LL);
    return _mm256_add_epi8(g8, ds);
}

INL void dec_iq1_s(const uint8_t *b, lb_block *k) {
    for (int v = 0; v < 8; v++) {
        uint16_t h = cb_rd16(b + 34 + 2 * v);
        uint64_t e[4];
        int neg[4];
        for (int l = 0; l < 4; l++) {
            e[l] = cb_iq1s_grid[b[2 + 4 * v + l] | ((h >> (3 * l)) & 7u) << 8];
            neg[l] = (h & 0x8000u) != 0;
        }
        k->w[v] = iq1_values(e, neg);
        k->sc[v] = _mm256_set1_epi16((short)(2 * ((h >> 12) & 7) + 1));
    }
    k->d = f16(b);
}

INL void dec_iq1_m(const uint8_t *b, lb_block *k) {
    uint16_t s[4];
    memcpy(s, b + 48, 8);
    for (int v = 0; v < 8; v++) {
        uint64_t e[4];
        int neg[4];
        for (int l = 0; l < 4; l++) {
            int en = 4 * v + l;
            unsigned n = (b[32 + en / 2] >> (4 * (en & 1))) & 0x0Fu;
            e[l] = cb_iq1s_grid[b[en] | (n & 7u) << 8];
            neg[l] = (n & 8u) != 0;
        }
        k->w[v] = iq1_values(e, neg);
        int s0 = (s[v / 2] >> (6 * (v & 1))) & 7, s1 = (s[v / 2] >> (6 * (v & 1) + 3)) & 7;
        k->sc[v] = lanes16(2 * s0 + 1, 2 * s1 + 1);
    }
    k->d = _cvtsh_ss((uint16_t)((s[0] >> 12) | ((s[1] >> 8) & 0x00F0u) | ((s[2] >> 4) & 0x0F00u) |
                                (s[3] & 0xF000u)));
}

INL void dec_tq2_0(const uint8_t *b, lb_block *k) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32 * h));
        for (int s = 0; s < 4; s++) k->w[4 * h + s] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
    }
    for (int v = 0; v < 8; v++) k->sc[v] = _mm256_set1_epi16(1);
    k->mins = _mm256_set1_epi16(1);
    k->d = f16(b + 64);
}

/* TQ1_0: the base-3 digit ((u8)(c * p) * 3) >> 8 of every byte c, p the power of its 16-bit lane */
INL __m256i tq1_digits(__m256i c, __m256i pw) {
    const __m256i lo8 = _mm256_set1_epi16(0x00FF), three = _mm256_set1_epi16(3);
    __m256i me = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(c, lo8), pw), lo8);
    __m256i mo = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(c, 8), pw), lo8);
    me = _mm256_srli_epi16(_mm256_mullo_epi16(me, three), 8);
    mo = _mm256_srli_epi16(_mm256_mullo_epi16(mo, three), 8);
    return _mm256_or_si256(me, _mm256_slli_epi16(mo, 8));
}

INL void dec_tq1_0(const uint8_t *b, lb_block *k) {
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)(const void *)b);
    const __m256i q1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)(b + 32)));
    const __m128i qh = _mm_set1_epi32((int)cb_rd32(b + 48));
    static const short pow3[5] = {1, 3, 9, 27, 81};
    for (int v = 0; v < 5; v++) k->w[v] = tq1_digits(q0, _mm256_set1_epi16(pow3[v]));
    k->w[5] = tq1_digits(q1, lanes16(1, 3));
    k->w[6] = tq1_digits(q1, lanes16(9, 27));
    k->w[7] = tq1_digits(_mm256_set_m128i(qh, _mm256_castsi256_si128(q1)),
                         _mm256_setr_epi16(81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 3, 3, 9, 9, 27, 27));
    for (int v = 0; v < 8; v++) k->sc[v] = _mm256_set1_epi16(1);
    k->mins = _mm256_set1_epi16(1);
    k->d = f16(b + 52);
}

INL void dec_q8_k(const uint8_t *b, lb_block *k) {
    for (int v = 0; v < 8; v++) {
        k->w[v] = _mm256_loadu_si256((const __m256i *)(const void *)(b + 4 + 32 * v));
        k->sc[v] = _mm256_set1_epi16(1);
    }
    memcpy(&k->d, b, 4);
}

/* ------------------------------------------------------------ integer block sums */

enum { LB_Q2_K, LB_Q3_K, LB_IQ2_XXS, LB_IQ3_XXS, LB_IQ4_XS, LB_IQ2_XS, LB_IQ2_S, LB_IQ3_S,
       LB_IQ1_S, LB_IQ1_M, LB_TQ1_0, LB_TQ2_0, LB_Q8_K };

INL int lb_signed(int kind) { /* signed weight bytes: |w| against sign(x, w) */
    return kind == LB_IQ4_XS || kind == LB_IQ1_S || kind == LB_IQ1_M || kind == LB_Q8_K;
}
INL int lb_sign_bits(int kind) { /* unsigned grid bytes and sign bits */
    return kind == LB_IQ2_XXS || kind == LB_IQ3_XXS || kind == LB_IQ2_XS || kind == LB_IQ2_S ||
           kind == LB_IQ3_S;
}
INL int lb_aux(int kind) { /* a second sum against the activation's bsums (k->mins) */
    return kind == LB_Q2_K || kind == LB_Q3_K || kind == LB_TQ1_0 || kind == LB_TQ2_0;
}

/* the 8 int32 lanes of scale * w * x over the block (Q3_K: w + 4, TQ: the digit q + 1, corrected
 * here through the activation's bsums: minus 4 or 1 times the sum of k->mins[j] * bsums[j]);
 * Q2_K: *aux = the lanes of its mins times bsums, for the second float step */
INL __m256i lb_isum_v(int kind, const lb_block *k, const cb_q8k_t *a, __m256i *aux) {
    __m256i acc = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 32 * v));
        __m256i p;
        if (lb_signed(kind)) {
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(k->w[v], k->w[v]), _mm256_sign_epi8(x, k->w[v]));
        } else if (lb_sign_bits(kind)) {
            p = _mm256_maddubs_epi16(k->w[v], _mm256_sign_epi8(x, k->sgn[v]));
        } else {
            p = _mm256_maddubs_epi16(k->w[v], x);
        }
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, k->sc[v]));
    }
    if (lb_aux(kind)) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)a->bsums);
        const __m256i m = _mm256_madd_epi16(k->mins, bs);
        if (kind == LB_Q2_K)
            *aux = m;
        else
            acc = _mm256_sub_epi32(acc, kind == LB_Q3_K ? _mm256_slli_epi32(m, 2) : m);
    }
    return acc;
}

INL void lb_decode(int kind, const uint8_t *blk, lb_block *k) {
    switch (kind) {
    case LB_Q2_K: dec_q2_k(blk, k); break;
    case LB_Q3_K: dec_q3_k(blk, k); break;
    case LB_IQ2_XXS: dec_iq2_xxs(blk, k); break;
    case LB_IQ3_XXS: dec_iq3_xxs(blk, k); break;
    case LB_IQ4_XS: dec_iq4_xs(blk, k); break;
    case LB_IQ2_XS: dec_iq2_xs(blk, k); break;
    case LB_IQ2_S: dec_iq2_s(blk, k); break;
    case LB_IQ3_S: dec_iq3_s(blk, k); break;
    case LB_IQ1_S: dec_iq1_s(blk, k); break;
    case LB_IQ1_M: dec_iq1_m(blk, k); break;
    case LB_TQ1_0: dec_tq1_0(blk, k); break;
    case LB_TQ2_0: dec_tq2_0(blk, k); break;
    default: dec_q8_k(blk, k); break;
    }
}

INL float lb_dscale(int kind) {
    switch (kind) {
    case LB_IQ2_XXS:
    case LB_IQ2_XS:
    case LB_IQ2_S:
    case LB_IQ1_S:
    case LB_IQ1_M: return 0.125f;
    case LB_IQ3_XXS: return 0.25f;
    default: return 1.0f;
    }
}

/* ------------------------------------------------------------ tiles */

/* NR rows x NT tokens, NR * NT <= 8: the pairs' block sums in one reduction (reduce_lanes), then
 * the scalar kernel's float operations on lane r*NT + t: acc + (d*dx)*(float)isum (IQ2/IQ1:
 * ((d*dx)*0.125), IQ3_XXS 0.25; Q2_K then - (dmin*dx)*(float)msum), out[r*out_nt + t]. */
INL void tile_lb(int kind, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                 const uint8_t *x, size_t xs, float *out, int out_nt) {
    static const size_t bytes[] = {84, 110, 66, 98, 136, 74, 82, 110, 50, 56, 54, 66, 292};
    const size_t bb = bytes[kind];
    int ri[8], ti[8];
    for (int p = 0; p < 8; p++) {
        ri[p] = p / NT < NR ? p / NT : 0;
        ti[p] = p % NT;
    }
    const __m256i row_idx = _mm256_loadu_si256((const __m256i *)(const void *)ri);
    const __m256i tok_idx = _mm256_loadu_si256((const __m256i *)(const void *)ti);
    __m256 facc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i v[8], m[8];
        float dr[8] = {0}, mr[8] = {0}, xd[8] = {0};
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * bb;
            prefetch_span(blk + (size_t)NR * CB_DEC_PF * ws, bb); /* the tiles ahead, into L2 */
            lb_block k;
            k.mins = _mm256_setzero_si256();
            k.dmin = 0.0f;
            lb_decode(kind, blk, &k);
            dr[r] = k.d;
            mr[r] = k.dmin;
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                if (r == 0) xd[t] = a->d;
                m[r * NT + t] = _mm256_setzero_si256();
                v[r * NT + t] = lb_isum_v(kind, &k, a, &m[r * NT + t]);
            }
        }
        const __m256 dw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(dr), row_idx);
        const __m256 dx = _mm256_permutevar8x32_ps(_mm256_loadu_ps(xd), tok_idx);
        __m256 dd = _mm256_mul_ps(dw, dx);
        if (lb_dscale(kind) != 1.0f) dd = _mm256_mul_ps(dd, _mm256_set1_ps(lb_dscale(kind)));
        facc = _mm256_add_ps(facc, _mm256_mul_ps(dd, _mm256_cvtepi32_ps(reduce_lanes(v, NR * NT))));
        if (kind == LB_Q2_K) {
            const __m256 dm = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(mr), row_idx), dx);
            facc = _mm256_sub_ps(facc, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(reduce_lanes(m, NR * NT))));
        }
    }
    store_lanes(facc, NR, NT, out, out_nt, 0);
}

/* the driver's shapes: one token up to 8 rows at once; 2 tokens 4 rows, 3-4 tokens 2 rows */
INL void tile_lb_any(int kind, int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                     size_t xs, int nt, float *out) {
    const int g = nt == 1 ? 8 : nt == 2 ? 4 : 2;
    for (int r = 0; r < nr; r += g) {
        const int n = nr - r < g ? nr - r : g;
        const uint8_t *wr = w + (size_t)r * ws;
        float *o = out + (size_t)r * nt;
        switch (nt) {
        case 1:
            switch (n) {
            case 8: tile_lb(kind, 8, 1, nb, wr, ws, x, xs, o, 1); break;
            case 4: tile_lb(kind, 4, 1, nb, wr, ws, x, xs, o, 1); break;
            default:
                for (int i = 0; i < n; i++) tile_lb(kind, 1, 1, nb, wr + (size_t)i * ws, ws, x, xs, o + i, 1);
                break;
            }
            break;
        case 2:
            if (n == 4) tile_lb(kind, 4, 2, nb, wr, ws, x, xs, o, 2);
            else for (int i = 0; i < n; i++) tile_lb(kind, 1, 2, nb, wr + (size_t)i * ws, ws, x, xs, o + 2 * i, 2);
            break;
        case 3:
            if (n == 2) tile_lb(kind, 2, 3, nb, wr, ws, x, xs, o, 3);
            else tile_lb(kind, 1, 3, nb, wr, ws, x, xs, o, 3);
            break;
        default:
            if (n == 2) tile_lb(kind, 2, 4, nb, wr, ws, x, xs, o, 4);
            else tile_lb(kind, 1, 4, nb, wr, ws, x, xs, o, 4);
            break;
        }
    }
}

#define LB_TILE(name, kind)                                                                   \
    static void name(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,       \
                     size_t xs, int nt, float *out) {                                         \
        tile_lb_any(kind, nb, w, ws, nr, x, xs, nt, out);                                     \
    }
LB_TILE(tile_q2_k, LB_Q2_K)
LB_TILE(tile_q3_k, LB_Q3_K)
LB_TILE(tile_iq2_xxs, LB_IQ2_XXS)
LB_TILE(tile_iq3_xxs, LB_IQ3_XXS)
LB_TILE(tile_iq4_xs, LB_IQ4_XS)
LB_TILE(tile_iq2_xs, LB_IQ2_XS)
LB_TILE(tile_iq2_s, LB_IQ2_S)
LB_TILE(tile_iq3_s, LB_IQ3_S)
LB_TILE(tile_iq1_s, LB_IQ1_S)
LB_TILE(tile_iq1_m, LB_IQ1_M)
LB_TILE(tile_tq1_0, LB_TQ1_0)
LB_TILE(tile_tq2_0, LB_TQ2_0)
LB_TILE(tile_q8_k, LB_Q8_K)

/* IQ4_NL: blocks of 32 against cb_q8a_t; acc += (d*dx) * (float)isum per block, as the scalar
 * kernel. The block's 32 values are decoded once per row and block, then meet every token. */
static void tile_iq4_nl(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                        size_t xs, int nt, float *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < nr; r++) {
        float acc[CB_TILE_R1];
        for (int t = 0; t < nt; t++) acc[t] = 0.0f;
        const uint8_t *wr = w + (size_t)r * ws;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + (size_t)b * 18;
            if (b + 4 < nb) _mm_prefetch((const char *)(blk + 4 * 18), _MM_HINT_T0);
            const __m256i wv = iq4_values(blk + 2), wa = _mm256_sign_epi8(wv, wv);
            const float d = f16(blk);
            for (int t = 0; t < nt; t++) {
                const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)a->qs);
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xv, wv)), ones);
                acc[t] += (d * a->d) * (float)hsum_epi32(p);
            }
        }
        for (int t = 0; t < nt; t++) out[r * nt + t] = acc[t];
    }
}

cb_tile_fn cb_avx2_lowbit_tile(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return tile_q2_k;
    case CB_TYPE_Q3_K: return tile_q3_k;
    case CB_TYPE_IQ2_XXS: return tile_iq2_xxs;
    case CB_TYPE_IQ3_XXS: return tile_iq3_xxs;
    case CB_TYPE_IQ4_XS: return tile_iq4_xs;
    case CB_TYPE_IQ4_NL: return tile_iq4_nl;
    case CB_TYPE_IQ2_XS: return tile_iq2_xs;
    case CB_TYPE_IQ2_S: return tile_iq2_s;
    case CB_TYPE_IQ3_S: return tile_iq3_s;
    case CB_TYPE_IQ1_S: return tile_iq1_s;
    case CB_TYPE_IQ1_M: return tile_iq1_m;
    case CB_TYPE_TQ1_0: return tile_tq1_0;
    case CB_TYPE_TQ2_0: return tile_tq2_0;
    case CB_TYPE_Q8_K: return tile_q8_k;
    default: return NULL;
    }
}

#pragma GCC pop_options
#else
/* Not x86-64 GCC/Clang: no AVX2 kernels (quant.c runs the scalar ones). */
cb_tile_fn cb_avx2_lowbit_tile(int type) {
    (void)type;
    return NULL;
}
#endif
