/* Private to the AVX-512 kernels, which are split per type family: quant_avx512.c (the
 * activation quantizers, the 32-block types, the float weights, the 32-block packed-row tiles and
 * the dispatch) and quant_avx512_k.c (the K-quants); see quant_avx512.c's opening comment. Here:
 * the build configuration (native with per-function target attributes, emulated on SIMDe with
 * CB_AVX512_EMULATE, or none off x86-64 GCC/Clang: CB_AVX512_ON 0), the helpers (static, always
 * inlined natively, compiled into each file that uses them, so moving a kernel between the files
 * changes none of its code), the dispatch macros, and the K-quant entry points quant_avx512.c
 * calls. Included by both files; tests/c/test_quant_avx512.c includes both into one unit. */
#ifndef COLIBRI_QUANT_AVX512_IMPL_H
#define COLIBRI_QUANT_AVX512_IMPL_H

#include "quant_impl.h"

#if defined(CB_AVX512_EMULATE)
#define CB_AVX512_FN(name) cb_avx512emu_##name
#define CB_AVX512_ON 1
#define CB_AVX512_TARGET
#define CB_AVX512_VNNI_TARGET
#define SIMDE_ENABLE_NATIVE_ALIASES
/* __m512 values passed to / returned from static functions: notes about an ABI not used here */
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#pragma GCC diagnostic pop
/* SIMDe 0.7.4 aliases _mm512_madd_epi16 with the masked form's four arguments */
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
/* SIMDe 0.7.4 lacks these: the same conversions on the two 256-bit halves. */
/* nor the masked word load (GCC's own needs AVX-512BW: a CPU without it fails to build):
 * the words where m is set, copied into a zeroed vector, so no byte past the mask is read */
static inline __m512i cb_emu_maskz_loadu_epi16(__mmask32 m, const void *p) {
    int16_t w[32] = {0};
    for (int i = 0; i < 32; i++)
        if ((m >> i) & 1u) memcpy(&w[i], (const uint8_t *)p + 2 * i, 2);
    return _mm512_loadu_si512(w);
}
#undef _mm512_maskz_loadu_epi16
#define _mm512_maskz_loadu_epi16 cb_emu_maskz_loadu_epi16
/* and it has the 128-bit lane shuffle under its own name only */
#undef _mm512_shuffle_i64x2
#define _mm512_shuffle_i64x2(a, b, imm) simde_mm512_shuffle_i64x2(a, b, imm)
/* the arithmetic shift and the 32-to-16-bit truncation, lane by lane */
#ifndef _mm512_srai_epi32
static inline __m512i cb_emu_srai_epi32(__m512i v, int n) {
    int32_t a[16];
    _mm512_storeu_si512(a, v);
    for (int i = 0; i < 16; i++) a[i] = (int32_t)((int64_t)a[i] >> n);
    return _mm512_loadu_si512(a);
}
#define _mm512_srai_epi32 cb_emu_srai_epi32
#endif
#ifndef _mm512_cvtepi32_epi16
static inline __m256i cb_emu_cvtepi32_epi16(__m512i v) {
    int32_t a[16];
    uint16_t h[16];
    _mm512_storeu_si512(a, v);
    for (int i = 0; i < 16; i++) h[i] = (uint16_t)a[i];
    return _mm256_loadu_si256((const __m256i *)(const void *)h);
}
#define _mm512_cvtepi32_epi16 cb_emu_cvtepi32_epi16
#endif
#ifndef _mm512_cvtepi8_epi32
static inline __m512i cb_emu_cvtepi8_epi32(__m128i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(b)),
                              _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)), 1);
}
#define _mm512_cvtepi8_epi32 cb_emu_cvtepi8_epi32
#endif
#ifndef _mm512_cvtepu8_epi32
static inline __m512i cb_emu_cvtepu8_epi32(__m128i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(b)),
                              _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), 1);
}
#define _mm512_cvtepu8_epi32 cb_emu_cvtepu8_epi32
#endif
#ifndef _mm512_cvtepi32_ps
static inline __m512 cb_emu_cvtepi32_ps(__m512i v) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v))),
                              _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)), 1);
}
#define _mm512_cvtepi32_ps cb_emu_cvtepi32_ps
#endif
#ifndef _mm512_cvtps_epi32
static inline __m512i cb_emu_cvtps_epi32(__m512 v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtps_epi32(lo)), _mm256_cvtps_epi32(hi),
                              1);
}
#define _mm512_cvtps_epi32 cb_emu_cvtps_epi32
#endif
#ifndef _mm512_cvtph_ps
static inline __m512 cb_emu_cvtph_ps(__m256i h) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_cvtph_ps(_mm256_castsi256_si128(h))),
                              _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), 1);
}
#define _mm512_cvtph_ps cb_emu_cvtph_ps
#endif
#ifndef _mm512_cvtepu16_epi32
static inline __m512i cb_emu_cvtepu16_epi32(__m256i h) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h))),
                              _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 1);
}
#define _mm512_cvtepu16_epi32 cb_emu_cvtepu16_epi32
#endif
#define CB_F16(p) cb_f16_to_f32(cb_rd16(p))
#elif defined(__x86_64__) && defined(__GNUC__)
#define CB_AVX512_FN(name) cb_avx512_##name
#define CB_AVX512_ON 1
#define CB_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#define CB_AVX512_VNNI_TARGET                                                                   \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#include <immintrin.h>
#define CB_F16(p) _cvtsh_ss(cb_rd16(p))
#else
#define CB_AVX512_FN(name) cb_avx512_##name
#define CB_AVX512_ON 0
#endif

#if CB_AVX512_ON

#ifdef CB_AVX512_EMULATE
/* emulated: let the compiler choose (forced inlining of SIMDe's code compiles for minutes) */
#define INL static inline
#define INLV static inline
#else
#define INL static inline __attribute__((always_inline)) CB_AVX512_TARGET
#define INLV static inline __attribute__((always_inline)) CB_AVX512_VNNI_TARGET
#endif

/* ------------------------------------------------------------ helpers */

INL __m256 hi_ps(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
INL __m256i hi_si(__m512i v) { return _mm512_extracti64x4_epi64(v, 1); }

INL __m512i join_si(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

INL __m512 join_ps(__m256 lo, __m256 hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* a 256-bit vector in the low half, zeros above */
INL __m512i zext_si(__m256i v) { return _mm512_inserti64x4(_mm512_setzero_si512(), v, 0); }

INL __m256i loadu256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INL __m512i loadu512(const void *p) { return _mm512_loadu_si512(p); }

INL float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

INL float hsum_ps(__m512 v) { return hsum256_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi_ps(v))); }

INL int hsum_epi32(__m512i v) {
    __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(v), hi_si(v));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INL float hmax_ps(__m512 v) {
    __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), hi_ps(v));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the int32 lanes 0..7 plus lanes 8..15 */
INL __m256i fold_epi32(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), hi_si(v)); }

INL int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Q4_K/Q5_K: cb_k4_scale_words in a register (p: the 12 scale bytes; reads 16): bytes sc[0..7]
 * in dwords 0..1, m[0..7] in dwords 2..3. The scalar version writes four words that a vector load
 * then reads back, a store-forwarding stall per row and block (the Q4_K decode tile: ~9%). */
INL __m128i k4_scales_of(__m128i x, __m128i y) { /* x = u0, u2, u1, u2; y = -, u0, -, u1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(x, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(y, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

INL __m128i k4_scale_vec(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p); /* u0, u1, u2, - */
    return k4_scales_of(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)));
}

/* the same from the block's first 16 bytes v = dd (d, dmin), u0, u1, u2 */
INL __m128i k4_scale_vec_dd(__m128i v) {
    return k4_scales_of(_mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)), _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)));
}

/* x with its bytes negated where w is negative (vpsignb for |w| * x, w != 0 lanes) */
INL __m512i sign_by(__m512i x, __m512i w) {
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
}

/* ------------------------------------------------------------ tiles and packed rows */

/* Decode streams each weight row once; the tiles prefetch the rows some tiles ahead at the same
 * offset (as quant_avx2.c; the K-quant tiles CB_DEC_PF512 tiles ahead). */
#ifndef CB_DEC_PF512
#define CB_DEC_PF512 4
#endif
INL void prefetch_span(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) cb_prefetch_l2(p + o);
    cb_prefetch_l2(p + bytes - 1);
}

/* the 16-row tiles' output: out[r * NT + t] = lane r of facc[t] */
INL void store16(const __m512 *facc, int NT, float *out) {
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        float tmp[16];
        _mm512_storeu_ps(tmp, facc[t]);
        for (int r = 0; r < 16; r++) out[r * NT + t] = tmp[r];
    }
}

/* the vpermd index taking words (2p, 2p+1) of a 32-byte activation chunk to [2p x 8 | 2p+1 x 8] */
INL __m512i pair_idx(int p) {
    return join_si(_mm256_set1_epi32(2 * p), _mm256_set1_epi32(2 * p + 1));
}

/* BODY(TYPE, NR, nt, ...) with nt (1..4) as a constant */
#define CB_TILE_BY_NT(BODY, TYPE, NR, n, w, ws, x, xs, out, nt, r)                             \
    switch (nt) {                                                                              \
    case 1: BODY(TYPE, NR, 1, n, w, ws, x, xs, out, nt, r); break;                             \
    case 2: BODY(TYPE, NR, 2, n, w, ws, x, xs, out, nt, r); break;                             \
    case 3: BODY(TYPE, NR, 3, n, w, ws, x, xs, out, nt, r); break;                             \
    default: BODY(TYPE, NR, 4, n, w, ws, x, xs, out, nt, r); break;                            \
    }

/* The rows-in-pairs dispatch: a cb_tile_fn NAME (with the target attribute TARGET) running the
 * tile body BODY(TYPE, NR, NT, ...) on nr rows, two at a time, nt <= 4 tokens. */
#define CB_DEFINE_TILE_AT(NAME, BODY, TYPE, TARGET)                                             \
    TARGET static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,  \
                            size_t xs, int nt, float *out) {                                   \
        for (int r = 0; r < nr; r += 2) {                                                      \
            const uint8_t *wr = w + (size_t)r * ws;                                            \
            if (nr - r >= 2) {                                                                 \
                CB_TILE_BY_NT(BODY, TYPE, 2, n, wr, ws, x, xs, out, nt, r)                     \
            } else {                                                                           \
                CB_TILE_BY_NT(BODY, TYPE, 1, n, wr, ws, x, xs, out, nt, r)                     \
            }                                                                                  \
        }                                                                                      \
    }
#define CB_DEFINE_TILE(NAME, BODY, TYPE) CB_DEFINE_TILE_AT(NAME, BODY, TYPE, CB_AVX512_TARGET)

/* The invariant tiles' dispatch: for one token R1 (8 or 4) rows at a time, then four (one
 * reduction serves them), the rest (and nt > 1) in pairs as CB_DEFINE_TILE_AT. */
#define CB_DEFINE_TILE4(NAME, BODY, TYPE, TARGET, R1)                                           \
    CB_DEFINE_TILE_AT(NAME##_pairs, BODY, TYPE, TARGET)                                         \
    TARGET static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,  \
                            size_t xs, int nt, float *out) {                                   \
        int r = 0;                                                                             \
        if (nt == 1) {                                                                         \
            for (; (R1) > 4 && nr - r >= (R1); r += (R1))                                      \
                BODY(TYPE, (R1), 1, n, w + (size_t)r * ws, ws, x, xs, out, nt, r);             \
            for (; nr - r >= 4; r += 4) BODY(TYPE, 4, 1, n, w + (size_t)r * ws, ws, x, xs, out, nt, r); \
        }                                                                                      \
        if (r < nr) NAME##_pairs(n, w + (size_t)r * ws, ws, nr - r, x, xs, nt, out + (size_t)r * nt); \
    }

/* As CB_DEFINE_TILE4, and with 2-4 tokens four rows at a time too (BODY(TYPE, 4, NT, ...)). */
#define CB_DEFINE_TILE4N(NAME, BODY, TYPE, TARGET, R1)                                          \
    CB_DEFINE_TILE_AT(NAME##_pairs, BODY, TYPE, TARGET)                                         \
    TARGET static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,  \
                            size_t xs, int nt, float *out) {                                   \
        int r = 0;                                                                             \
        if (nt == 1)                                                                           \
            for (; (R1) > 4 && nr - r >= (R1); r += (R1))                                      \
                BODY(TYPE, (R1), 1, n, w + (size_t)r * ws, ws, x, xs, out, nt, r);             \
        for (; nr - r >= 4; r += 4) {                                                          \
            const uint8_t *wr = w + (size_t)r * ws;                                            \
            CB_TILE_BY_NT(BODY, TYPE, 4, n, wr, ws, x, xs, out, nt, r)                         \
        }                                                                                      \
        if (r < nr) NAME##_pairs(n, w + (size_t)r * ws, ws, nr - r, x, xs, nt, out + (size_t)r * nt); \
    }

/* A packed-row tile NAME (nt <= 4 tokens) of the body BODY(TYPE, NT, ...); RPV: the VNNI one. */
#define CB_DEFINE_RP(NAME, BODY, TYPE)                                                          \
    CB_AVX512_TARGET static void NAME(const uint8_t *pk, int64_t nb, const uint8_t *xa,        \
                                      size_t xs, int nt, float *out) {                         \
        switch (nt) {                                                                           \
        case 1: BODY(TYPE, 1, pk, nb, xa, xs, out); break;                                      \
        case 2: BODY(TYPE, 2, pk, nb, xa, xs, out); break;                                      \
        case 3: BODY(TYPE, 3, pk, nb, xa, xs, out); break;                                      \
        default: BODY(TYPE, 4, pk, nb, xa, xs, out); break;                                     \
        }                                                                                       \
    }

#define CB_DEFINE_RPV(NAME, BODY, TYPE)                                                         \
    CB_AVX512_VNNI_TARGET static void NAME(const uint8_t *pk, int64_t nb, const uint8_t *xa,   \
                                           size_t xs, int nt, float *out) {                    \
        switch (nt) {                                                                           \
        case 1: BODY(TYPE, 1, pk, nb, xa, xs, out); break;                                      \
        case 2: BODY(TYPE, 2, pk, nb, xa, xs, out); break;                                      \
        case 3: BODY(TYPE, 3, pk, nb, xa, xs, out); break;                                      \
        default: BODY(TYPE, 4, pk, nb, xa, xs, out); break;                                     \
        }                                                                                       \
    }

#if defined(CB_AVX512_EMULATE)
void CB_AVX512_FN(rp16_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out);
void CB_AVX512_FN(r16_tile_vnni)(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                 size_t xs, int nt, float *out);
#endif

/* The 16-row packing (quant_avx512_pack.c): cb_avx2_rp16_pack's bytes. */
void CB_AVX512_FN(rp16_pack)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                             uint8_t *dst);

/* The K-quant kernels (quant_avx512_k.c) for the dispatch in quant_avx512.c: the tile of
 * Q4_K/Q5_K/Q6_K (NULL for another type), their packed-row tiles, without and with VNNI, and the
 * tile of the Q6_K_R16 / Q4_K_R16 layouts. */
cb_tile_fn CB_AVX512_FN(k_tile)(int type);
cb_tile_fn CB_AVX512_FN(k_tile_vnni)(int type);
void CB_AVX512_FN(k_rp_tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                             int nt, float *out);
void CB_AVX512_FN(k_rp16_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                    size_t xs, int nt, float *out);
void CB_AVX512_FN(r16k_tile_vnni)(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out);
void CB_AVX512_FN(k_rp_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out);

#endif /* CB_AVX512_ON */

#endif
