/* AVX-512 (F, BW, DQ, VL; + F16C) packing of the 16-row groups that the AVX512-VNNI packed tiles
 * read (quant_avx512.c rpv16_tile, quant_avx512_k.c rpkv16_tile): the same bytes as
 * cb_avx2_rp16_pack (the layouts are documented above rpk16_pack in quant_avx2_k.c for the
 * K-quants and above rp16_pack in quant_avx2.c for the 32-block types), for Q4_K, Q5_K, Q6_K,
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0; the other types (MXFP4, I4_G128) go to cb_avx2_rp16_pack.
 *
 * How: a packed step is one 32-bit word of each of the 16 rows (64 bytes, lanes = rows), and
 * every unpacking operation (nibble masks, shifts, bit merges) works within a byte. So the raw
 * block bytes of the 16 rows are transposed first, as 32-bit words (tr16x8: 8 words of 16 rows,
 * rows r and r + 8 in the halves of one vector, then the 8x8 transpose in both halves at once,
 * whole 64-byte steps out; tr16x4: 4 words of 16 rows, one row per 128-bit lane), and the
 * unpacking then runs on whole steps: a Q4_K super-block transposes its 128 quant bytes instead
 * of its 256 values, and the scales, mins and d are unpacked for the 16 rows together. Rows
 * past nr read a zero block (every packed byte of a zero block is the zero rows' byte).
 * Emulation: compiled again with CB_AVX512_EMULATE by tests/c/test_quant_avx512.c, as
 * cb_avx512emu_rp16_pack on SIMDe (see quant_avx512_impl.h).
 * Ownership: every pointer is borrowed for one call; nothing is allocated.
 */
#include "quant_avx512_impl.h"

#if CB_AVX512_ON

/* Software prefetch, a few lines ahead in each of the 16 rows: the block-at-a-time walk over 16
 * rows (the same offset of every row, then the next offset) is not a pattern the hardware
 * prefetchers follow well; without it the packing of a matrix streamed from DRAM ran at 0.6x
 * the AVX2 packing's speed (which reads each row's block whole), with it at the same speed
 * (memory-bound), while from cache it is 2-3x faster either way. (The matmul driver also
 * prefetches the next group into L2 while the tiles run.) K-quants: super-blocks ahead. */
#define PACK_PF_K 2
#define PACK_PF_32 256 /* bytes */

/* what rows past nr read: every type's zero block packs to the zero rows' bytes (MXFP4's would
 * not, it is not packed here) */
static const uint8_t zero_block[256] __attribute__((aligned(64)));

/* words off/4 .. off/4 + 7 of the 16 rows p[r]: o[i] lane r = word i of row r */
INL void tr16x8(const uint8_t *const *p, size_t off, __m512i *o) {
    __m512i z[8], t[8], u[8];
    #pragma GCC unroll 8
    for (int r = 0; r < 8; r++) z[r] = join_si(loadu256(p[r] + off), loadu256(p[r + 8] + off));
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    #pragma GCC unroll 2
    for (int g = 0; g < 2; g++) { /* rows 4g..4g+3 (and 8 + 4g..) */
        u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
    /* u[i] lane 0 / 2: rows 0..3 / 8..11 of word i, lane 1 / 3 of word i + 4; u[4 + i] the
     * same for rows 4..7 / 12..15 */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        o[i] = _mm512_permutex2var_epi64(u[i], lo, u[4 + i]);
        o[i + 4] = _mm512_permutex2var_epi64(u[i], hi, u[4 + i]);
    }
}

/* words off/4 .. off/4 + 3 of the 16 rows: o[g] lane r = word g of row r */
INL void tr16x4(const uint8_t *const *p, size_t off, __m512i *o) {
    __m512i z[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; k++) { /* rows 4k..4k+3, one per 128-bit lane */
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(p[4 * k] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * k + 1] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * k + 2] + off)), 2);
        z[k] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(const void *)(p[4 * k + 3] + off)), 3);
    }
    /* [word g of rows 0..7 | word g + 1 of rows 0..7] from two 4-row vectors */
    const __m512i i01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i i23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
    __m512i a01 = _mm512_permutex2var_epi32(z[0], i01, z[1]), b01 = _mm512_permutex2var_epi32(z[2], i01, z[3]);
    __m512i a23 = _mm512_permutex2var_epi32(z[0], i23, z[1]), b23 = _mm512_permutex2var_epi32(z[2], i23, z[3]);
    o[0] = _mm512_shuffle_i64x2(a01, b01, 0x44);
    o[1] = _mm512_shuffle_i64x2(a01, b01, 0xEE);
    o[2] = _mm512_shuffle_i64x2(a23, b23, 0x44);
    o[3] = _mm512_shuffle_i64x2(a23, b23, 0xEE);
}

/* 16 f16 (the low 16 bits of each lane) as floats, the conversion of the AVX2 packing */
INL __m512 f16_lanes(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

INL void st(uint8_t *o, __m512i v) { _mm512_store_si512((void *)o, v); }

/* a byte shuffle within each 32-bit lane: byte j of the result = byte c[j] (-1: zero) */
INL __m512i lane_bytes(__m512i v, int c0, int c1, int c2, int c3) {
    char c[16];
    const int cs[4] = {c0, c1, c2, c3};
    for (int q = 0; q < 4; q++)
        for (int j = 0; j < 4; j++) c[4 * q + j] = (char)(cs[j] < 0 ? -128 : 4 * q + cs[j]);
    const __m128i ctl = _mm_setr_epi8(c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9],
                                      c[10], c[11], c[12], c[13], c[14], c[15]);
    return _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(ctl));
}

/* x shifted left by n bits (right by -n), 32-bit lanes */
INL __m512i shift32(__m512i x, int n) {
    return n > 0 ? _mm512_slli_epi32(x, (unsigned)n) : (n < 0 ? _mm512_srli_epi32(x, (unsigned)-n) : x);
}

/* ------------------------------------------------------------ K-quants (super-blocks of 256) */

/* One Q4_K / Q5_K super-block of the 16 rows p[r] into o (quant_avx2_k.c rpk16_pack). */
INL void pack_q45k(int q5, const uint8_t *const *p, uint8_t *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    __m512i hd[4], qh[8];
    tr16x4(p, 0, hd); /* d | dmin << 16, then the 12 scale bytes as words u0, u1, u2 */
    if (q5) tr16x8(p, 16, qh);
    const size_t qo = q5 ? 48 : 16;
    #pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* qs bytes 32c..32c+31: values 64c + l (low), 64c + 32 + l */
        __m512i qs[8];
        tr16x8(p, qo + 32 * (size_t)c, qs);
        #pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            __m512i lo = _mm512_and_si512(qs[i], m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi32(qs[i], 4), m4);
            if (q5) { /* bit 2c (2c + 1) of the qh byte as 0x10 */
                lo = _mm512_or_si512(lo, _mm512_and_si512(shift32(qh[i], 4 - 2 * c), b4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(shift32(qh[i], 3 - 2 * c), b4));
            }
            st(o + 64 * (16 * c + i), lo);
            st(o + 64 * (16 * c + 8 + i), hi);
        }
    }
    /* cb_k4_scale_words on 16 rows: sc[0..7] in (u0n, u1n), m[0..7] in (mlo, u3n) */
    const __m512i m3f = _mm512_set1_epi8(0x3F), m0f = _mm512_set1_epi8(0x0F);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const __m512i u0 = hd[1], u1 = hd[2], u2 = hd[3];
    const __m512i sc[2] = {
        _mm512_and_si512(u0, m3f),
        _mm512_or_si512(_mm512_and_si512(u2, m0f), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m30))};
    const __m512i mn[2] = {
        _mm512_and_si512(u1, m3f),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m0f),
                        _mm512_and_si512(_mm512_srli_epi32(u1, 2), m30))};
    uint8_t *so = o + 4096, *mo = so + 64 * 8;
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) { /* scale j as int32, min j as the int16 pair (m, m) */
        st(so + 64 * j, lane_bytes(sc[j / 4], j % 4, -1, -1, -1));
        st(mo + 64 * j, lane_bytes(mn[j / 4], j % 4, -1, j % 4, -1));
    }
    _mm512_store_ps((void *)(mo + 512), f16_lanes(hd[0]));
    _mm512_store_ps((void *)(mo + 576), f16_lanes(_mm512_srli_epi32(hd[0], 16)));
}

/* One Q6_K super-block of the 16 rows p[r] into o: per half h (ql bytes 64h.., qh bytes
 * 128 + 32h..), values 128h + 32j + l from ql[64h + 32(j & 1) + l] (nibble j >> 1) and the
 * 2-bit field j of qh[32h + l]. */
INL void pack_q6k(const uint8_t *const *p, uint8_t *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    #pragma GCC unroll 1
    for (int h = 0; h < 2; h++) {
        __m512i hv[8], q[8];
        tr16x8(p, 128 + 32 * (size_t)h, hv);
        tr16x8(p, 64 * (size_t)h, q);
        #pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            st(o + 64 * (32 * h + i), _mm512_or_si512(_mm512_and_si512(q[i], m4),
                                                      _mm512_and_si512(_mm512_slli_epi32(hv[i], 4), m30)));
            st(o + 64 * (32 * h + 16 + i),
               _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(q[i], 4), m4),
                               _mm512_and_si512(hv[i], m30)));
        }
        tr16x8(p, 64 * (size_t)h + 32, q);
        #pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            st(o + 64 * (32 * h + 8 + i), _mm512_or_si512(_mm512_and_si512(q[i], m4),
                                                          _mm512_and_si512(_mm512_slli_epi32(hv[i], 2), m30)));
            st(o + 64 * (32 * h + 24 + i),
               _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(q[i], 4), m4),
                               _mm512_and_si512(_mm512_srli_epi32(hv[i], 2), m30)));
        }
    }
    __m512i s[4], dv[4];
    tr16x4(p, 192, s);  /* the 16 int8 scales */
    tr16x4(p, 194, dv); /* word 3: scales 14, 15 and d */
    uint8_t *so = o + 4096, *mo = so + 64 * 16;
    #pragma GCC unroll 16
    for (int j = 0; j < 16; j++) /* scale j sign-extended: its byte to the top, shifted down */
        st(so + 64 * j, _mm512_srai_epi32(_mm512_slli_epi32(s[j / 4], 24 - 8 * (j % 4)), 24));
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++) /* the int16 pair (32 sc_2k, 32 sc_2k+1): (byte << 8) >> 3 */
        st(mo + 64 * k,
           _mm512_srai_epi16(lane_bytes(s[k / 2], -1, 2 * (k % 2), -1, 2 * (k % 2) + 1), 3));
    const __m512 d = f16_lanes(_mm512_srli_epi32(dv[3], 16));
    _mm512_store_ps((void *)(mo + 512), d);
    _mm512_store_ps((void *)(mo + 576), d);
}

INL void pack_k(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QKK;
    const size_t bb = type == CB_TYPE_Q4_K ? 144 : (type == CB_TYPE_Q5_K ? 176 : 210);
    const size_t bst = cb_rp16_bstride(type);
    const uint8_t *p[16];
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < 16; r++) p[r] = r < nr ? w + (size_t)r * ws + (size_t)b * bb : zero_block;
        if (b + PACK_PF_K < nb) /* see PACK_PF_K */
            for (int r = 0; r < nr; r++) prefetch_span(p[r] + PACK_PF_K * bb, bb);
        if (type == CB_TYPE_Q6_K) pack_q6k(p, dst + (size_t)b * bst);
        else pack_q45k(type == CB_TYPE_Q5_K, p, dst + (size_t)b * bst);
    }
}

CB_AVX512_TARGET static void pack_q4_k(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    pack_k(CB_TYPE_Q4_K, w, ws, nr, cols, dst);
}
CB_AVX512_TARGET static void pack_q5_k(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    pack_k(CB_TYPE_Q5_K, w, ws, nr, cols, dst);
}
CB_AVX512_TARGET static void pack_q6_k(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    pack_k(CB_TYPE_Q6_K, w, ws, nr, cols, dst);
}

/* ------------------------------------------------------------ 32-blocks (quant_avx2.c rp16_pack)
 *
 * One block of the 16 rows p[r] into o: the 8 steps, d[16] (and m[16]). Q4_0/Q4_1: value l of
 * qs byte l's low nibble, value 16 + l of its high nibble; Q5_0/Q5_1: bit l of qh as 0x10 on
 * value l; Q8_0: the 32 bytes, + 128 (xor 0x80). */
INL void pack_b32(int type, const uint8_t *const *p, uint8_t *o) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    __m512i hd[4];
    tr16x4(p, 0, hd); /* word 0: d (| m << 16); Q5_1: word 1 qh */
    if (type == CB_TYPE_Q8_0) {
        __m512i q[8];
        tr16x8(p, 2, q);
        #pragma GCC unroll 8
        for (int s = 0; s < 8; s++) st(o + 64 * s, _mm512_xor_si512(q[s], _mm512_set1_epi8((char)0x80)));
    } else {
        const int q5 = type == CB_TYPE_Q5_0 || type == CB_TYPE_Q5_1;
        const size_t qo = type == CB_TYPE_Q4_0 ? 2 : (type == CB_TYPE_Q5_1 ? 8 : (q5 ? 6 : 4));
        __m512i qs[4], qh[4];
        tr16x4(p, qo, qs);
        if (type == CB_TYPE_Q5_0) tr16x4(p, 2, qh);
        const __m512i h = type == CB_TYPE_Q5_1 ? hd[1] : qh[0];
        #pragma GCC unroll 8
        for (int s = 0; s < 8; s++) { /* values 4s..4s+3 */
            __m512i v = s < 4 ? qs[s] : _mm512_srli_epi32(qs[s - 4], 4);
            v = _mm512_and_si512(v, m4);
            if (q5) { /* bits 4s..4s+3 of qh: byte s/2, bits 4(s%2) + j for byte j */
                const int n = 4 * (s % 2);
                __m512i hb = lane_bytes(h, s / 2, s / 2, s / 2, s / 2);
                __mmask64 k = _mm512_test_epi8_mask(hb, _mm512_set1_epi32(
                    (int)(0x01u << n | 0x0200u << n | 0x040000u << n | 0x08000000u << n)));
                v = _mm512_or_si512(v, _mm512_maskz_mov_epi8(k, b4));
            }
            st(o + 64 * s, v);
        }
    }
    _mm512_store_ps((void *)(o + 512), f16_lanes(hd[0]));
    if (type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1)
        _mm512_store_ps((void *)(o + 576), f16_lanes(_mm512_srli_epi32(hd[0], 16)));
}

INL void pack_32(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const size_t bb = type == CB_TYPE_Q4_0 ? 18 : type == CB_TYPE_Q4_1 ? 20 : type == CB_TYPE_Q5_0 ? 22
                      : type == CB_TYPE_Q5_1 ? 24 : 34;
    const size_t bst = cb_rp16_bstride(type);
    const uint8_t *p[16];
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < 16; r++) p[r] = r < nr ? w + (size_t)r * ws + (size_t)b * bb : zero_block;
        /* PACK_PF_32 bytes ahead in each row, as this block enters a new line of row 0 */
        if ((b * (int64_t)bb) % 64 < (int64_t)bb && (b + 1) * (int64_t)bb + PACK_PF_32 < nb * (int64_t)bb)
            for (int r = 0; r < nr; r++) cb_prefetch_l2(p[r] + PACK_PF_32);
        pack_b32(type, p, dst + (size_t)b * bst);
    }
}

#define CB_DEFINE_PACK32(NAME, TYPE)                                                            \
    CB_AVX512_TARGET static void NAME(const uint8_t *w, size_t ws, int nr, int64_t cols,       \
                                      uint8_t *dst) {                                          \
        pack_32(TYPE, w, ws, nr, cols, dst);                                                    \
    }
CB_DEFINE_PACK32(pack_q4_0, CB_TYPE_Q4_0)
CB_DEFINE_PACK32(pack_q4_1, CB_TYPE_Q4_1)
CB_DEFINE_PACK32(pack_q5_0, CB_TYPE_Q5_0)
CB_DEFINE_PACK32(pack_q5_1, CB_TYPE_Q5_1)
CB_DEFINE_PACK32(pack_q8_0, CB_TYPE_Q8_0)

void CB_AVX512_FN(rp16_pack)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                             uint8_t *dst) {
    switch (type) {
    case CB_TYPE_Q4_K: pack_q4_k(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_K: pack_q5_k(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q6_K: pack_q6_k(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_0: pack_q4_0(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q4_1: pack_q4_1(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_0: pack_q5_0(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q5_1: pack_q5_1(w, ws, nr, cols, dst); break;
    case CB_TYPE_Q8_0: pack_q8_0(w, ws, nr, cols, dst); break;
    default: cb_avx2_rp16_pack(type, w, ws, nr, cols, dst); break;
    }
}

#else
/* Not x86-64 GCC/Clang: no AVX-512 kernels (cb_cpu_level() is scalar there). */
void CB_AVX512_FN(rp16_pack)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                             uint8_t *dst) {
    cb_avx2_rp16_pack(type, w, ws, nr, cols, dst);
}
#endif
