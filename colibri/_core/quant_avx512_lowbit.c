/* AVX-512 (F/BW/DQ/VL) direct tiles of the low-bit types Q2_K, Q3_K, TQ2_0, IQ4_XS, IQ2_XXS,
 * IQ3_XXS, IQ1_S (activations cb_q8k_t), through cb_avx512_lowbit_tile for quant.c; the other
 * low-bit types keep the AVX2 tiles of quant_avx2_lowbit.c. The scalar kernels (quant_lowbit.c,
 * quant_iq.c) define the math, and these tiles give their results bit for bit: batch invariant
 * by construction, the same in the fast mode.
 *
 * Per super-block and row the 256 weights are decoded once into 4 vectors of 64 bytes (values
 * 64v..64v+63) as magnitudes |w| with a 64-bit mask of the negative ones (Q2_K: its unsigned
 * 0..3, the mins taken out through the activation's bsums), and per 16-value lane the integer
 * sub-block scale as words. A (row, token) pair's block product is then vpmaddubsw(|w|, x
 * negated under the mask) and vpmaddwd with the scales: 16 int32 lanes whose sum is the scalar
 * kernel's exact isum. The tile's pairs (up to 16: 8 rows x 1 token, 4 x 4) are summed
 * together by a transposing reduction into one vector of isums, lane r*nt + t, and the float
 * step runs on those lanes in the scalar kernel's operations and order (acc + (d*dx)*(float)isum,
 * IQ2/IQ1 ((d*dx)*0.125), IQ3_XXS 0.25, Q2_K then - (dmin*dx)*(float)msum; no FMA contraction
 * under -std=c11): every lane rounds as the scalar code does.
 * No int16 saturation: |w| <= 4 (Q3_K), 3 (Q2_K), 62 (IQ3), 43 (IQ2), 9 (IQ1), 127 (IQ4) against
 * |x| <= 127, two a pair: at most 2*127*127. Activations never hold -128 (cb_q8k_t), so
 * negating them is exact.
 * Compiled natively with per-function target attributes (quant_avx512_impl.h), and again on
 * SIMDe by tests/c/test_quant_avx512_lowbit.c (CB_AVX512_EMULATE, cb_avx512emu_* names). The
 * grid entries of the i-quants are loaded one by one (vpgatherdq was 10% slower on IQ2_XXS).
 * Every pointer is borrowed for one call. */
#include "quant_avx512_impl.h"

#if CB_AVX512_ON
#include "quant_iq_tables.h"

enum { L5_Q2_K, L5_Q3_K, L5_TQ2_0, L5_IQ4_XS, L5_IQ2_XXS, L5_IQ3_XXS, L5_IQ1_S };

typedef struct {
    __m512i w[4], sc[4];
    uint64_t neg[4];
    __m256i mins; /* Q2_K: its 16 mins as words */
} l5_block;

/* words of 128-bit lane k all equal to a_k */
INL __m512i lane_words(int a0, int a1, int a2, int a3) {
    const int b0 = a0 * 0x10001, b1 = a1 * 0x10001, b2 = a2 * 0x10001, b3 = a3 * 0x10001;
    return _mm512_setr_epi32(b0, b0, b0, b0, b1, b1, b1, b1, b2, b2, b2, b2, b3, b3, b3, b3);
}

/* 16 sub-block scales as words (a 256-bit vector, zero-extended): zmm v's lane k gets scale 4v+k */
INL void scales16(__m256i s16, l5_block *k) {
    const __m512i z = zext_si(s16);
    for (int v = 0; v < 4; v++)
        k->sc[v] = _mm512_permutexvar_epi16(lane_words(4 * v, 4 * v + 1, 4 * v + 2, 4 * v + 3), z);
}

/* 8 group scales (32 values each) as words at w0 + positions: zmm v's lanes get group 2v, 2v+1 */
INL void scales8(__m512i z, const int pos[8], l5_block *k) {
    for (int v = 0; v < 4; v++)
        k->sc[v] = _mm512_permutexvar_epi16(
            lane_words(pos[2 * v], pos[2 * v], pos[2 * v + 1], pos[2 * v + 1]), z);
}

/* 2-bit fields: zmm v = values 64v.. of the 2-bit layout (value 128h + 32s + l: bits 2s of
 * byte 32h + l of q) */
INL __m512i bits2(const uint8_t *q, int v) {
    const __m512i b = _mm512_broadcast_i64x4(loadu256(q + 32 * (v >> 1)));
    const int s = 2 * (v & 1);
    const __m512i sh = join_si(_mm256_set1_epi16((short)(2 * s)), _mm256_set1_epi16((short)(2 * s + 2)));
    return _mm512_and_si512(_mm512_srlv_epi16(b, sh), _mm512_set1_epi8(3));
}

INL void d5_q2_k(const uint8_t *b, l5_block *k) {
    for (int v = 0; v < 4; v++) {
        k->w[v] = bits2(b + 16, v);
        k->neg[v] = 0;
    }
    const __m128i s = _mm_loadu_si128((const __m128i *)(const void *)b), m4 = _mm_set1_epi8(0x0F);
    scales16(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), k);
    k->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
}

INL void d5_q3_k(const uint8_t *b, l5_block *k) {
    const __m512i hm = _mm512_broadcast_i64x4(loadu256(b)), four = _mm512_set1_epi8(4);
    for (int v = 0; v < 4; v++) {
        const __m512i lo = bits2(b + 32, v);
        const int bit = 2 * v; /* the hmask bit of values 32*bit.. (low half), 32*(bit+1).. */
        const __m512i sel = join_si(_mm256_set1_epi8((char)(1 << bit)), _mm256_set1_epi8((char)(1 << (bit + 1))));
        const __mmask64 hi = _mm512_test_epi8_mask(hm, sel); /* set: q = lo >= 0, else lo - 4 < 0 */
        k->w[v] = _mm512_mask_mov_epi8(_mm512_sub_epi8(four, lo), hi, lo);
        k->neg[v] = ~(uint64_t)hi;
    }
    /* 6-bit scales: low nibbles of bytes 0..7 (j < 8) and their high nibbles (j >= 8), high
     * 2 bits from bytes 8..11 >> 2*(j/4) */
    const uint8_t *s = b + 96;
    uint64_t s8;
    memcpy(&s8, s, 8);
    const __m128i v8 = _mm_cvtsi64_si128((long long)s8), m4 = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(v8, m4), _mm_and_si128(_mm_srli_epi16(v8, 4), m4));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)cb_rd32(s + 8)), _mm_setr_epi32(0, 2, 4, 6)),
                                     _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    scales16(_mm256_cvtepi8_epi16(sc), k);
}

INL void d5_tq2_0(const uint8_t *b, l5_block *k) { /* the digits q + 1 (0..3), unsigned */
    for (int v = 0; v < 4; v++) {
        k->w[v] = bits2(b, v);
        k->neg[v] = 0;
        k->sc[v] = _mm512_set1_epi16(1);
    }
}

/* signed values: magnitudes and the mask of the negative ones */
INL void set_signed(l5_block *k, int v, __m512i val) {
    k->w[v] = _mm512_abs_epi8(val);
    k->neg[v] = (uint64_t)_mm512_movepi8_mask(val);
}

INL void d5_iq4_xs(const uint8_t *b, l5_block *k) {
    const __m512i kv = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)cb_iq4nl_values));
    const __m512i sh = lane_words(0, 4, 0, 4), m4 = _mm512_set1_epi8(0x0F);
    for (int v = 0; v < 4; v++) { /* groups 2v, 2v+1: [low nibbles, high nibbles] each */
        const __m512i q = _mm512_castsi256_si512(loadu256(b + 8 + 32 * v));
        const __m512i qq = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(1, 1, 0, 0));
        set_signed(k, v, _mm512_shuffle_epi8(kv, _mm512_and_si512(_mm512_srlv_epi16(qq, sh), m4)));
    }
    const __m128i x = _mm_cvtsi32_si128((int)cb_rd32(b + 4)), m4x = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(x, m4x), _mm_and_si128(_mm_srli_epi16(x, 4), m4x)));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi16(_mm_set1_epi16((short)cb_rd16(b + 2)),
                                                    _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)),
                                     _mm_set1_epi16(3));
    const __m128i sc = _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
    static const int pos[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    scales8(_mm512_castsi128_si512(sc), pos, k);
}

/* IQ2_XXS / IQ3_XXS: the 8 aux words (4 x 7 sign bits, the scale in bits 28..31) -> the 256 sign
 * bits (each 7-bit index and its parity bit: cb_iq_ksigns) and the scales 2s + 1 */
INL void iq_aux(__m256i aux, l5_block *k) {
    const __m256i s = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7F)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7F00))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7F0000)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7F000000))));
    __m256i p = _mm256_xor_si256(s, _mm256_srli_epi32(s, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    const __m256i sg = _mm256_or_si256(s, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7));
    _mm256_storeu_si256((__m256i *)(void *)k->neg, sg);
    const __m256i sc = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(aux, 28), 1), _mm256_set1_epi32(1));
    /* packed to words within 128-bit lanes: group ib at word ib (ib < 4) or ib + 4 */
    static const int pos[8] = {0, 1, 2, 3, 8, 9, 10, 11};
    scales8(_mm512_castsi256_si512(_mm256_packs_epi32(sc, sc)), pos, k);
}

/* 8 entries of a 64-bit grid table (loaded one by one: faster than vpgatherdq here) */
INL __m512i grid64i(const uint64_t *tab, const uint16_t *i) {
    return _mm512_setr_epi64((long long)tab[i[0]], (long long)tab[i[1]], (long long)tab[i[2]], (long long)tab[i[3]],
                             (long long)tab[i[4]], (long long)tab[i[5]], (long long)tab[i[6]], (long long)tab[i[7]]);
}

INL void d5_iq2_xxs(const uint8_t *b, l5_block *k) {
    const __m512i all = loadu512(b + 2); /* 8 x (4 index bytes, aux word) */
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0);
    iq_aux(_mm512_castsi512_si256(_mm512_permutexvar_epi32(odd, all)), k);
    for (int v = 0; v < 4; v++) {
        const uint8_t *q = b + 2 + 16 * v;
        const uint16_t i[8] = {q[0], q[1], q[2], q[3], q[8], q[9], q[10], q[11]};
        k->w[v] = grid64i(cb_iq2xxs_grid, i);
    }
}

INL void d5_iq3_xxs(const uint8_t *b, l5_block *k) {
    iq_aux(loadu256(b + 66), k);
    for (int v = 0; v < 4; v++) {
        const uint8_t *q = b + 2 + 16 * v;
        const uint32_t *t = cb_iq3xxs_grid;
        k->w[v] = _mm512_setr_epi32((int)t[q[0]], (int)t[q[1]], (int)t[q[2]], (int)t[q[3]], (int)t[q[4]], (int)t[q[5]],
                                    (int)t[q[6]], (int)t[q[7]], (int)t[q[8]], (int)t[q[9]], (int)t[q[10]], (int)t[q[11]],
                                    (int)t[q[12]], (int)t[q[13]], (int)t[q[14]], (int)t[q[15]]);
    }
}

INL void d5_iq1_s(const uint8_t *b, l5_block *k) {
    /* the 32 grid indices at once: qs[4ib + l] | ((qh[ib] >> 3l) & 7) << 8, as words */
    const __m512i qh = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(b + 34)));
    const __m512i hw = _mm512_permutexvar_epi16(
        _mm512_setr_epi32(0, 0, 0x10001, 0x10001, 0x20002, 0x20002, 0x30003, 0x30003, 0x40004, 0x40004, 0x50005,
                          0x50005, 0x60006, 0x60006, 0x70007, 0x70007), qh);
    const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hw, _mm512_set1_epi64(0x0009000600030000LL)), _mm512_set1_epi16(7));
    const __m512i ix = _mm512_or_si512(_mm512_cvtepu8_epi16(loadu256(b + 2)), _mm512_slli_epi16(hb, 8));
    uint16_t idx[32];
    _mm512_storeu_si512(idx, ix);
    for (int v = 0; v < 4; v++) { /* groups 2v, 2v+1 */
        const int h0 = cb_rd16(b + 34 + 4 * v), h1 = cb_rd16(b + 36 + 4 * v);
        const __m512i g = grid64i(cb_iq1s_grid, idx + 8 * v);
        const __m512i g8 = _mm512_and_si512(_mm512_slli_epi16(g, 3), _mm512_set1_epi8((char)0xF8));
        const uint64_t dn = (h0 & 0x8000 ? 0xFFFFFFFFull : 0) | (h1 & 0x8000 ? 0xFFFFFFFF00000000ull : 0);
        const __m512i ds = _mm512_mask_blend_epi8((__mmask64)dn, _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
        set_signed(k, v, _mm512_add_epi8(g8, ds));
        k->sc[v] = join_si(_mm256_set1_epi16((short)(2 * ((h0 >> 12) & 7) + 1)),
                           _mm256_set1_epi16((short)(2 * ((h1 >> 12) & 7) + 1)));
    }
}

INL size_t l5_bytes(int kind) {
    static const size_t bytes[] = {84, 110, 66, 136, 66, 98, 50};
    return bytes[kind];
}

INL void l5_decode(int kind, const uint8_t *b, l5_block *k) {
    switch (kind) {
    case L5_Q2_K: d5_q2_k(b, k); break;
    case L5_Q3_K: d5_q3_k(b, k); break;
    case L5_TQ2_0: d5_tq2_0(b, k); break;
    case L5_IQ4_XS: d5_iq4_xs(b, k); break;
    case L5_IQ2_XXS: d5_iq2_xxs(b, k); break;
    case L5_IQ3_XXS: d5_iq3_xxs(b, k); break;
    default: d5_iq1_s(b, k); break;
    }
}

/* the transposing reduction: lane-wise sums of 128-bit lanes' pairs, ... */
INL __m512i red1(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
INL __m512i red2(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
INL __m512i red3(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
}

/* v[0..N) (N = 8 or 16; the rest of 16 unused) -> the two vectors of level 3: per source p,
 * lanes 4(p/8)*... w[0] = [sum of lanes 0-7 | 8-15 of sources 0-3, then of 4-7], w[1] the same
 * for sources 8..15 (zero when N == 8) */
INL void reduce_w(const __m512i *v, int N, __m512i w[2]) {
    __m512i t[8], u[4];
    for (int i = 0; i < N / 2; i++) t[i] = red1(v[2 * i], v[2 * i + 1]);
    for (int j = 0; j < N / 4; j++) u[j] = red2(t[2 * j], t[2 * j + 1]);
    w[0] = red3(u[0], u[1]);
    w[1] = N > 8 ? red3(u[2], u[3]) : _mm512_setzero_si512();
}

/* lane p: the sum of v[p]'s 16 lanes */
INL __m512i reduce_full(const __m512i *v, int N) {
    __m512i w[2];
    reduce_w(v, N, w);
    return red3(w[0], w[1]);
}

/* v[p] = [8 lanes of A | 8 lanes of B]: lane p of *a the sum of A, of *b the sum of B */
INL void reduce_split(const __m512i *v, int N, __m512i *a, __m512i *b) {
    __m512i w[2];
    reduce_w(v, N, w);
    *a = _mm512_shuffle_i32x4(w[0], w[1], 0x88);
    *b = _mm512_shuffle_i32x4(w[0], w[1], 0xDD);
}

INL float l5_dscale(int kind) {
    switch (kind) {
    case L5_IQ2_XXS:
    case L5_IQ1_S: return 0.125f;
    case L5_IQ3_XXS: return 0.25f;
    default: return 1.0f;
    }
}

/* the offset of a block's f16 d */
INL size_t l5_doff(int kind) {
    switch (kind) {
    case L5_Q2_K: return 80;
    case L5_Q3_K: return 108;
    case L5_TQ2_0: return 64;
    default: return 0;
    }
}

#define L5_VNNI 0
#define L5_FN(n) n
#define L5_ATTR INL
#define L5_TARGET CB_AVX512_TARGET
#include "quant_avx512_lowbit_tile.h"
#undef L5_VNNI
#undef L5_FN
#undef L5_ATTR
#undef L5_TARGET
#define L5_VNNI 1
#define L5_FN(n) n##_vnni
#define L5_ATTR INLV
#define L5_TARGET CB_AVX512_VNNI_TARGET
#include "quant_avx512_lowbit_tile.h"

cb_tile_fn CB_AVX512_FN(lowbit_tile)(int type, int vnni) { return vnni ? l5_tile_vnni(type) : l5_tile(type); }

#else
cb_tile_fn CB_AVX512_FN(lowbit_tile)(int type, int vnni) {
    (void)type;
    (void)vnni;
    return NULL;
}
#endif
