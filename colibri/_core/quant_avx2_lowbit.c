/* AVX2 direct tiles of the low-bit types people download most: Q2_K, Q3_K, IQ2_XXS, IQ3_XXS,
 * IQ4_XS (super-blocks of 256 values, activations cb_q8k_t) and IQ4_NL (blocks of 32, cb_q8a_t),
 * for quant.c through cb_avx2_lowbit_tile (quant_avx2.c's dispatch asks here for the types it
 * does not hold). The scalar kernels (quant_lowbit.c, quant_iq.c) define the math.
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
 * Ranges (no int16 saturation): vpmaddubsw pairs reach 2*3*127 (Q2_K), 2*7*127 (Q3_K, q + 4),
 * 2*43*127 (IQ2_XXS), 2*62*127 (IQ3_XXS), 2*127*127 = 32258 (IQ4, |w| against sign(x, w)).
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
    __m256i sgn_bits[8]; /* IQ2_XXS / IQ3_XXS: the sign bytes of the 32 values (0xFF: negative) */
    __m256i mins;        /* Q2_K: the 16 mins as int16; Q3_K: the 16 scales as int16 */
    float d, dmin;
} lb_block;

INL __m256i lanes16(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

/* 32 bytes: byte k = 0xFF where bit k%8 of byte k/8 of the 32-bit word s is set */
INL __m256i expand_signs(uint32_t s) {
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bits), bits);
}

/* the 4 ksigns bytes of a 32-value group, from 4 x 7 sign bits */
INL uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)cb_iq_ksigns[aux & 127] | (uint32_t)cb_iq_ksigns[(aux >> 7) & 127] << 8 |
           (uint32_t)cb_iq_ksigns[(aux >> 14) & 127] << 16 |
           (uint32_t)cb_iq_ksigns[(aux >> 21) & 127] << 24;
}

/* ------------------------------------------------------------ decoders */

INL void dec_q2_k(const uint8_t *b, lb_block *k) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16 + 32 * h));
        for (int s = 0; s < 4; s++) {
            int v = 4 * h + s;
            k->w[v] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m3);
            k->sc[v] = lanes16(b[2 * v] & 0x0F, b[2 * v + 1] & 0x0F);
        }
    }
    const __m128i sc = _mm_loadu_si128((const __m128i *)(const void *)b);
    k->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
    k->d = f16(b + 80);
    k->dmin = f16(b + 82);
}

INL void dec_q3_k(const uint8_t *b, lb_block *k) {
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b);
    const uint8_t *s = b + 96;
    int16_t sc[16];
    for (int j = 0; j < 16; j++) {
        int lo = (s[j & 7] >> (4 * (j >> 3))) & 0x0F, hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        sc[j] = (int16_t)((lo | hi << 4) - 32);
    }
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32 + 32 * h));
        for (int t = 0; t < 4; t++) {
            int v = 4 * h + t;
            const __m256i bit = _mm256_set1_epi8((char)(1 << v));
            __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
            k->w[v] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * t), m3), hi);
            k->sc[v] = lanes16(sc[2 * v], sc[2 * v + 1]);
        }
    }
    k->mins = _mm256_loadu_si256((const __m256i *)(const void *)sc);
    k->d = f16(b + 108);
}

INL void dec_iq2_xxs(const uint8_t *b, lb_block *k) {
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *g = b + 2 + 8 * ib;
        uint32_t aux1 = cb_rd32(g + 4);
        k->w[ib] = _mm256_setr_epi64x((long long)cb_iq2xxs_grid[g[0]], (long long)cb_iq2xxs_grid[g[1]],
                                      (long long)cb_iq2xxs_grid[g[2]], (long long)cb_iq2xxs_grid[g[3]]);
        k->sgn_bits[ib] = expand_signs(ksigns4(aux1));
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
        k->sgn_bits[ib] = expand_signs(ksigns4(aux));
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
    uint16_t sh = cb_rd16(b + 2);
    for (int ib = 0; ib < 8; ib++) {
        int lo = (b[4 + ib / 2] >> (4 * (ib & 1))) & 0x0F, hi = (sh >> (2 * ib)) & 3;
        k->w[ib] = iq4_values(b + 8 + 16 * ib);
        k->sc[ib] = _mm256_set1_epi16((short)((lo | hi << 4) - 32));
    }
    k->d = f16(b);
}

/* ------------------------------------------------------------ integer block sums */

enum { LB_Q2_K, LB_Q3_K, LB_IQ2_XXS, LB_IQ3_XXS, LB_IQ4_XS };

/* sum over the block of scale * w * x (Q3_K: with w + 4, the correction applied by the caller
 * through *aux); Q2_K: *aux = sum of min_j * bsums_j */
INL int lb_isum(int kind, const lb_block *k, const cb_q8k_t *a, int *aux) {
    __m256i acc = _mm256_setzero_si256();
    for (int v = 0; v < 8; v++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(a->qs + 32 * v));
        __m256i p;
        if (kind == LB_IQ4_XS) {
            p = _mm256_maddubs_epi16(_mm256_sign_epi8(k->w[v], k->w[v]), _mm256_sign_epi8(x, k->w[v]));
        } else if (kind == LB_IQ2_XXS || kind == LB_IQ3_XXS) {
            const __m256i s = _mm256_or_si256(k->sgn_bits[v], _mm256_set1_epi8(1)); /* -1 | +1 */
            p = _mm256_maddubs_epi16(k->w[v], _mm256_sign_epi8(x, s));
        } else {
            p = _mm256_maddubs_epi16(k->w[v], x);
        }
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, k->sc[v]));
    }
    if (kind == LB_Q2_K || kind == LB_Q3_K) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)a->bsums);
        *aux = hsum_epi32(_mm256_madd_epi16(k->mins, bs));
    }
    return hsum_epi32(acc);
}

/* ------------------------------------------------------------ tiles */

INL void tile_lb(int kind, int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                 size_t xs, int nt, float *out) {
    static const size_t bytes[] = {84, 110, 66, 98, 136};
    const size_t bb = bytes[kind];
    for (int r = 0; r < nr; r++) {
        float acc[CB_TILE_R1];
        for (int t = 0; t < nt; t++) acc[t] = 0.0f;
        const uint8_t *wr = w + (size_t)r * ws;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = wr + (size_t)b * bb;
            if (b + 2 < nb) _mm_prefetch((const char *)(blk + 2 * bb), _MM_HINT_T0);
            lb_block k;
            switch (kind) {
            case LB_Q2_K: dec_q2_k(blk, &k); break;
            case LB_Q3_K: dec_q3_k(blk, &k); break;
            case LB_IQ2_XXS: dec_iq2_xxs(blk, &k); break;
            case LB_IQ3_XXS: dec_iq3_xxs(blk, &k); break;
            default: dec_iq4_xs(blk, &k); break;
            }
            for (int t = 0; t < nt; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                int aux = 0, isum = lb_isum(kind, &k, a, &aux);
                switch (kind) {
                case LB_Q2_K:
                    acc[t] += (k.d * a->d) * (float)isum;
                    acc[t] -= (k.dmin * a->d) * (float)aux;
                    break;
                case LB_Q3_K: acc[t] += (k.d * a->d) * (float)(isum - 4 * aux); break;
                case LB_IQ2_XXS: acc[t] += (k.d * a->d * 0.125f) * (float)isum; break;
                case LB_IQ3_XXS: acc[t] += (k.d * a->d * 0.25f) * (float)isum; break;
                default: acc[t] += (k.d * a->d) * (float)isum; break;
                }
            }
        }
        for (int t = 0; t < nt; t++) out[r * nt + t] = acc[t];
    }
}

static void tile_q2_k(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                      size_t xs, int nt, float *out) {
    tile_lb(LB_Q2_K, nb, w, ws, nr, x, xs, nt, out);
}
static void tile_q3_k(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                      size_t xs, int nt, float *out) {
    tile_lb(LB_Q3_K, nb, w, ws, nr, x, xs, nt, out);
}
static void tile_iq2_xxs(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                         size_t xs, int nt, float *out) {
    tile_lb(LB_IQ2_XXS, nb, w, ws, nr, x, xs, nt, out);
}
static void tile_iq3_xxs(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                         size_t xs, int nt, float *out) {
    tile_lb(LB_IQ3_XXS, nb, w, ws, nr, x, xs, nt, out);
}
static void tile_iq4_xs(int64_t nb, const uint8_t *w, size_t ws, int nr, const uint8_t *x,
                        size_t xs, int nt, float *out) {
    tile_lb(LB_IQ4_XS, nb, w, ws, nr, x, xs, nt, out);
}

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
