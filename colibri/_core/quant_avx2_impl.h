/* Private to the AVX2 kernels, which are split per type family: quant_avx2.c (the activation
 * quantizers, the 32-block types, the float weights, the packed-row entry points and the
 * dispatch) and quant_avx2_k.c (the K-quants). Include it only between a file's
 * `#pragma GCC target("avx2,fma,f16c")` and its pop_options (x86-64 GCC/Clang). The helpers are
 * static and always inlined, compiled into each file that uses them: moving a kernel from one
 * file to the other changes none of its code. */
#ifndef COLIBRI_QUANT_AVX2_IMPL_H
#define COLIBRI_QUANT_AVX2_IMPL_H

#include <immintrin.h>

#include "quant_impl.h"

#define INL static inline __attribute__((always_inline))
/* decode tiles prefetch the rows CB_DEC_PF tiles ahead (see prefetch_span) */
#ifndef CB_DEC_PF
#define CB_DEC_PF 4
#endif
/* the decode walks prefetch this far ahead of their reads (1, 4 and 8 KiB were no faster) */
#ifndef CB_DEC_PF_BYTES
#define CB_DEC_PF_BYTES 2048
#endif

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

/* Lane k (k < K <= 8) = the sum of the 8 int32 lanes of v[k] (lanes past K: anything). One
 * reduction serves all of a tile's (row, token) elements: for K <= 4, 3 hadds and a fold. */
INL __m256i reduce_lanes(const __m256i *v, int K) {
    if (K <= 2) {
        __m256i h = _mm256_hadd_epi32(v[0], K > 1 ? v[1] : v[0]);
        h = _mm256_hadd_epi32(h, h);
        __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        return _mm256_set_m128i(r, r);
    }
    __m256i h01 = _mm256_hadd_epi32(v[0], v[1]);
    __m256i h23 = _mm256_hadd_epi32(v[2], K > 3 ? v[3] : v[2]);
    __m256i h03 = _mm256_hadd_epi32(h01, h23); /* [v0..v3 low halves | v0..v3 high halves] */
    if (K <= 4) {
        __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h03), _mm256_extracti128_si256(h03, 1));
        return _mm256_set_m128i(r, r);
    }
    __m256i h45 = _mm256_hadd_epi32(v[4], K > 5 ? v[5] : v[4]);
    __m256i h67 = _mm256_hadd_epi32(K > 6 ? v[6] : v[4], K > 7 ? v[7] : v[4]);
    __m256i h47 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h03, h47, 0x20),
                            _mm256_permute2x128_si256(h03, h47, 0x31));
}

/* 8 floats from an array the unrolled tiles keep in registers */
INL __m256 set8(const float *a) {
    return _mm256_setr_ps(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]);
}

/* The invariant tiles' accumulator lanes k = r * NT + t, as out[(r + r_off) * out_nt + t]. */
INL void store_lanes(__m256 acc, int NR, int NT, float *out, int out_nt, int r_off) {
    float tmp[8];
    _mm256_storeu_ps(tmp, acc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = tmp[r * NT + t];
}

/* Decode (one token) streams each weight row once. The decode walks (rows32_dec, rows_k_dec)
 * read rows one after another and prefetch CB_DEC_PF_BYTES ahead of where they read. A tile
 * reading rows r..r+NR-1 side by side (I4_G128, the INV = 0 tiles) makes short streams the
 * hardware prefetcher restarts on at every row: it prefetches the same offset of the rows
 * CB_DEC_PF tiles ahead (Gemma 3 270M decode 17.3 -> 12.1 CPU ms/token at 1 thread with 4). */
INL void prefetch_span(const uint8_t *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) cb_prefetch_l2(p + o);
    cb_prefetch_l2(p + bytes - 1);
}
INL void prefetch_span_l1(const uint8_t *p, size_t bytes) { /* the walks: CB_DEC_PF_BYTES ahead */
    for (size_t o = 0; o < bytes; o += 64) cb_prefetch_l1(p + o);
    cb_prefetch_l1(p + bytes - 1);
}

/* a * b + c, rounded once (the vector tiles' fma on one lane) */
INL float fma1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

/* an f16 at p as a float */
INL float f16(const uint8_t *p) { return _cvtsh_ss(cb_rd16(p)); }

INL int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 8x8 transpose of 32-bit words: o[s] = word s of v[0..7]. */
INL void transpose8(const __m256i *v, __m256i *o) {
    __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    o[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    o[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    o[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    o[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    o[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    o[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    o[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    o[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

/* transpose8 stored: o[32*s ..] = word s of v[0..7] (o 32-byte aligned). */
INL void transpose_store8(const __m256i *v, uint8_t *o) {
    __m256i t[8];
    transpose8(v, t);
    __m256i *ov = (__m256i *)(void *)o;
    #pragma GCC unroll 8
    for (int s = 0; s < 8; s++) _mm256_store_si256(ov + s, t[s]);
}

/* The rows-in-pairs dispatch: a cb_tile_fn NAME running the tile body BODY(TYPE, INV, NR, NT,
 * ...) on nr rows, two at a time (decode with INV == 2: four, sharing one reduction). */
#define CB_DEFINE_TILE(NAME, BODY, TYPE, INV)                                                    \
    static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,         \
                     size_t xs, int nt, float *out) {                                          \
        for (int r = 0; r < nr; r += 2) {                                                      \
            const uint8_t *wr = w + (size_t)r * ws;                                            \
            if (INV == 2 && nt == 1 && nr - r >= 4) { /* decode: one reduction, 4 rows */     \
                BODY(TYPE, INV, 4, 1, n, wr, ws, x, xs, out, nt, r);                           \
                r += 2;                                                                        \
            } else if (nr - r >= 2) {                                                          \
                switch (nt) {                                                                  \
                case 1: BODY(TYPE, INV, 2, 1, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 2: BODY(TYPE, INV, 2, 2, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 3: BODY(TYPE, INV, 2, 3, n, wr, ws, x, xs, out, nt, r); break;                 \
                default: BODY(TYPE, INV, 2, 4, n, wr, ws, x, xs, out, nt, r); break;                \
                }                                                                              \
            } else {                                                                           \
                switch (nt) {                                                                  \
                case 1: BODY(TYPE, INV, 1, 1, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 2: BODY(TYPE, INV, 1, 2, n, wr, ws, x, xs, out, nt, r); break;                 \
                case 3: BODY(TYPE, INV, 1, 3, n, wr, ws, x, xs, out, nt, r); break;                 \
                default: BODY(TYPE, INV, 1, 4, n, wr, ws, x, xs, out, nt, r); break;                \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

/* A batch-invariant cb_tile_fn NAME whose decode (one token) is the walk DEC(TYPE, n, w, ws, nr,
 * x, out) and whose other calls run the tile body BODY. */
#define CB_DEFINE_TILE_DEC(NAME, BODY, TYPE, DEC)                                              \
    CB_DEFINE_TILE(NAME##_tiles, BODY, TYPE, 1)                                                \
    static void NAME(int64_t n, const uint8_t *w, size_t ws, int nr, const uint8_t *x,         \
                     size_t xs, int nt, float *out) {                                          \
        if (nt == 1)                                                                           \
            DEC(TYPE, n, w, ws, nr, x, out);                                                   \
        else                                                                                   \
            NAME##_tiles(n, w, ws, nr, x, xs, nt, out);                                        \
    }

/* The K-quant kernels (quant_avx2_k.c), for the dispatch in quant_avx2.c. */
/* The Q4_K/Q5_K/Q6_K tile: batch-invariant (fast 0; cb_avx2_tile) or not (fast 1;
 * cb_avx2_tile_fast); NULL for another type. */
cb_tile_fn cb_avx2_k_tile(int type, int fast);
/* cb_avx2_rp_group_bytes, cb_avx2_rp_pack and cb_avx2_rp_tile for the K-quants. */
size_t cb_avx2_k_rp_group_bytes(int type, int64_t cols);
void cb_avx2_k_rp_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);
void cb_avx2_k_rp_tile(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                       int nt, float *out);
/* cb_avx2_rp16_group_bytes and cb_avx2_rp16_pack for the K-quants. */
size_t cb_avx2_k_rp16_group_bytes(int type, int64_t cols);
void cb_avx2_k_rp16_pack(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                         uint8_t *dst);

#endif
