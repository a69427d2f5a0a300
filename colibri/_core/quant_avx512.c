/* AVX-512 (F, BW, DQ, VL; + FMA, F16C) kernels for quant.c: activation quantizers, the
 * register-tiled dot products of every block type, and the packed-row matmul tile.
 *
 * Compiled per function with a target attribute whatever the build's -march, and only called when
 * cb_cpu_level() >= CB_SIMD_AVX512 (AVX-512 F/BW/DQ/VL; VNNI only in the *_vnni packed tiles,
 * called at CB_SIMD_AVX512_VNNI, with their own target attribute). The math is the
 * scalar kernels' (quant.c), exactly as in quant_avx2.c: the same activation rounding
 * (round-to-nearest-even of x*127/max|x|, saturated to int8), exact int32 block sums, float
 * scaling per block; only the float summation order differs from the other paths.
 * What 512 bits change against quant_avx2.c (same tiles, same streaming order):
 *   - 32-blocks (Q4_0 ... MXFP4): two consecutive blocks per vector (lanes 0..7 block b, 8..15
 *     block b+1), each lane scaled by its own block's d_w*d_x; an odd last block runs with a zero
 *     upper half. I4_G128: a half group (two activation blocks) per vector.
 *   - K-quants: 64 values (two sub-blocks / four Q6_K groups) per vector, int16 scales per half.
 *   - float weights: 16 values per step.
 *   - packed-row matmul: the AVX2 packing (quant_avx2.c, cb_avx2_rp_pack: 8 rows as lanes) is
 *     reused; one 512-bit vector holds two packing steps (rows 0..7 of steps s and s+1), the
 *     activation words of both steps are placed with one permute, and the int32 halves are added
 *     before the (8-lane) float scaling, so the integer block sums are the AVX2 ones.
 *   - signed weights (Q8_0, MXFP4): there is no 512-bit vpsignb; |w| times x negated where w < 0
 *     (a byte mask from the sign bits), the same products; the VNNI tiles instead offset them by
 *     128 (an xor) and take 128 * sum(x) out of the integer sums.
 *
 * Emulation (tests): with CB_AVX512_EMULATE defined, this file is compiled against SIMDe (SIMD
 * Everywhere, header-only portable implementations of the Intel intrinsics) instead of
 * <immintrin.h>, without target attributes, and its exported names become cb_avx512emu_* (see
 * CB_AVX512_FN) so tests/c/test_quant_avx512.c can #include it beside the native copy and check
 * the AVX-512 code on CPUs without AVX-512. A few 512-bit intrinsics SIMDe 0.7.4 lacks are
 * defined in quant_avx512_impl.h (emulation only) from the same operation on the two 256-bit
 * halves.
 * Files, per type family (as the AVX2 kernels): this file holds the activation quantizers, the
 * 32-block types (Q4_0 ... MXFP4, I4_G128), the float weights, the 32-block packed-row tiles and
 * the dispatch (tile, rp_tile, rp_tile_vnni); quant_avx512_k.c the K-quants (Q4_K, Q5_K, Q6_K:
 * tiles and packed-row tiles), reached through CB_AVX512_FN(k_*); quant_avx512_impl.h the build
 * configuration (native or emulated), the always-inline helpers both compile and the dispatch
 * macros. The emulation test #includes both files.
 * Ownership: every pointer is borrowed for one call; nothing is allocated.
 */
#include "quant_avx512_impl.h"

#if CB_AVX512_ON

/* ------------------------------------------------------------ activation quantizers */

/* 16 floats * id -> 16 int8 (round to nearest even, saturated), *sum = their sum */
INL __m128i quant16(const float *v, __m512 id, int *sum) {
    __m512 s = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(v), id),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i i = _mm512_cvtps_epi32(s); /* integral already: exact */
    *sum = hsum_epi32(i);
    return _mm512_cvtsepi32_epi8(i);
}

INL float amax_n(const float *v, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < n; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(v + j)));
    return hmax_ps(m);
}

CB_AVX512_TARGET void CB_AVX512_FN(quantize_q8a)(const float *x, int64_t n, void *dst) {
    cb_q8a_t *o = dst;
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const float *v = x + b * CB_QK;
        float amax = amax_n(v, CB_QK);
        float d = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        int s0, s1;
        _mm_storeu_si128((__m128i *)(void *)o[b].qs, quant16(v, id, &s0));
        _mm_storeu_si128((__m128i *)(void *)(o[b].qs + 16), quant16(v + 16, id, &s1));
        o[b].d = d;
        o[b].isum = s0 + s1;
        o[b].s = d * (float)(s0 + s1);
    }
}

CB_AVX512_TARGET void CB_AVX512_FN(quantize_q8k)(const float *x, int64_t n, void *dst) {
    cb_q8k_t *o = dst;
    for (int64_t b = 0; b < n / CB_QKK; b++) {
        const float *v = x + b * CB_QKK;
        float amax = amax_n(v, CB_QKK);
        __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        o[b].d = amax / 127.0f;
        for (int g = 0; g < 16; g++) {
            int s;
            _mm_storeu_si128((__m128i *)(void *)(o[b].qs + 16 * g), quant16(v + 16 * g, id, &s));
            o[b].bsums[g] = (int16_t)s;
        }
    }
}

/* zero point of the packed-row layout (quant_avx2.c rp_z) */
INL int rp_z(int type) {
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_I4_G128: return 8;
    case CB_TYPE_Q5_0: return 16;
    case CB_TYPE_MXFP4: return 12;
    default: return 0;
    }
}

/* The packed-row activation layout of cb_avx2_rp_quantize (quant_avx2.c): qs[cols], then
 * float d[nb], int32 z*isum[nb] (z = cb_rp_act_z: 128 for Q8_0), float s[nb] = d*isum. */
CB_AVX512_TARGET void CB_AVX512_FN(rp_quantize)(int type, const float *x, int64_t cols,
                                                uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const int z = cb_rp_act_z(type);
    float *dx = (float *)(void *)(dst + cols);
    int32_t *zi = (int32_t *)(void *)(dx + nb);
    float *sx = (float *)(void *)(zi + nb);
    for (int64_t b = 0; b < nb; b++) {
        const float *v = x + b * CB_QK;
        float amax = amax_n(v, CB_QK);
        float d = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        int s0, s1;
        _mm_storeu_si128((__m128i *)(void *)(dst + 32 * b), quant16(v, id, &s0));
        _mm_storeu_si128((__m128i *)(void *)(dst + 32 * b + 16), quant16(v + 16, id, &s1));
        dx[b] = d;
        zi[b] = z * (s0 + s1);
        sx[b] = d * (float)(s0 + s1);
    }
}

/* ------------------------------------------------------------ 32-blocks with cb_q8a_t */

/* Two blocks' 16 nibble bytes -> 64 bytes: [low nibbles p0, high nibbles p0, low p1, high p1]
 * (values 0..31 of block p0, then of block p1); p1 NULL gives zeros there. */
INL __m512i nibbles2(const uint8_t *p0, const uint8_t *p1) {
    __m128i v0 = _mm_loadu_si128((const __m128i *)(const void *)p0);
    __m128i v1 = p1 ? _mm_loadu_si128((const __m128i *)(const void *)p1) : _mm_setzero_si128();
    __m256i t = _mm256_set_m128i(v1, v0);
    __m512i z = join_si(t, _mm256_srli_epi16(t, 4)); /* [v0, v1, v0>>4, v1>>4] */
    z = _mm512_shuffle_i32x4(z, z, 0xD8);             /* [v0, v0>>4, v1, v1>>4] */
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0F));
}

/* 0x10 in byte j where bit j of the (qh1 << 32 | qh0) is set (Q5_0/Q5_1 fifth bits) */
INL __m512i fifth_bits2(const uint8_t *p0, const uint8_t *p1) {
    uint64_t m = (uint64_t)cb_rd32(p0) | (p1 ? (uint64_t)cb_rd32(p1) << 32 : 0);
    return _mm512_maskz_mov_epi8((__mmask64)m, _mm512_set1_epi8(0x10));
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

INL float scale32(int type, const uint8_t *b) {
    return type == CB_TYPE_MXFP4 ? cb_e8m0_half(b[0]) : CB_F16(b);
}

/* Blocks p0 and p1 (NULL: none, zeros) as 64 bytes: unsigned q for Q4_0/Q4_1/Q5_0/Q5_1, signed
 * for Q8_0/MXFP4. */
INL __m512i unpack64(int type, const uint8_t *p0, const uint8_t *p1) {
    switch (type) {
    case CB_TYPE_Q4_0: return nibbles2(p0 + 2, p1 ? p1 + 2 : NULL);
    case CB_TYPE_Q4_1: return nibbles2(p0 + 4, p1 ? p1 + 4 : NULL);
    case CB_TYPE_Q5_0:
        return _mm512_or_si512(nibbles2(p0 + 6, p1 ? p1 + 6 : NULL),
                               fifth_bits2(p0 + 2, p1 ? p1 + 2 : NULL));
    case CB_TYPE_Q5_1:
        return _mm512_or_si512(nibbles2(p0 + 8, p1 ? p1 + 8 : NULL),
                               fifth_bits2(p0 + 4, p1 ? p1 + 4 : NULL));
    case CB_TYPE_Q8_0:
        return join_si(loadu256(p0 + 2), p1 ? loadu256(p1 + 2) : _mm256_setzero_si256());
    default: { /* MXFP4 */
        const __m512i table = _mm512_broadcast_i32x4(
            _mm_loadu_si128((const __m128i *)(const void *)cb_mxfp4_values));
        return _mm512_shuffle_epi8(table, nibbles2(p0 + 1, p1 ? p1 + 1 : NULL));
    }
    }
}

INL void tile32(int type, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const int offset = type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1;
    /* Q4_0/Q5_0: unsigned q times x, minus zero point * sum(x), spread over the block's 8
     * lanes: isum (Q4_0: 8*isum/8) or 2*isum (Q5_0) per lane */
    const int zp = type == CB_TYPE_Q4_0 ? 1 : (type == CB_TYPE_Q5_0 ? 2 : 0);
    const int unsig = offset || zp;
    const size_t bb = bytes32(type);
    const __m512i ones = _mm512_set1_epi16(1);
    __m512 acc[2][4];
    float off[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            acc[r][t] = _mm512_setzero_ps();
            off[r][t] = 0.0f;
        }
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb; /* an odd last block runs alone in the low half */
        __m512i wq[2], aw[2];
        __m512 dv[2]; /* [d of block b x 8 | d of block b+1 x 8] */
        float m0[2] = {0.0f, 0.0f}, m1[2] = {0.0f, 0.0f};
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *p0 = w + (size_t)r * ws + (size_t)b * bb, *p1 = two ? p0 + bb : NULL;
            prefetch_span(p0 + (size_t)NR * ws, two ? 2 * bb : bb);
            wq[r] = unpack64(type, p0, p1);
            aw[r] = unsig ? wq[r] : _mm512_abs_epi8(wq[r]);
            dv[r] = join_ps(_mm256_set1_ps(scale32(type, p0)),
                            _mm256_set1_ps(two ? scale32(type, p1) : 0.0f));
            if (offset) {
                m0[r] = CB_F16(p0 + 2);
                m1[r] = two ? CB_F16(p1 + 2) : 0.0f;
            }
        }
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
            const __m512i xv = join_si(loadu256(a[0].qs), two ? loadu256(a[1].qs)
                                                              : _mm256_setzero_si256());
            const __m512 dx = join_ps(_mm256_set1_ps(a[0].d), _mm256_set1_ps(two ? a[1].d : 0.0f));
            const __m512i zs = join_si(_mm256_set1_epi32(a[0].isum),
                                       _mm256_set1_epi32(two ? a[1].isum : 0));
            #pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                __m512i xr = unsig ? xv : sign_by(xv, wq[r]);
                __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(aw[r], xr), ones);
                if (zp) {
                    p = _mm512_sub_epi32(p, zs);
                    if (zp == 2) p = _mm512_sub_epi32(p, zs);
                }
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dv[r], dx),
                                            acc[r][t]);
                if (offset) {
                    off[r][t] += m0[r] * a[0].s;
                    if (two) off[r][t] += m1[r] * a[1].s;
                }
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]) + off[r][t];
}

/* ------------------------------------------------------------ 32-blocks, batch invariant (VNNI)
 *
 * The direct tiles that sum in the order of the AVX2 invariant tiles and the packed tiles
 * (quant_avx2.c, INV): per block and (row, token) the exact int32 sum of q*x (zero points out),
 * then acc = fma((float)isum, d_w*d_x, acc) (Q4_1/Q5_1: then acc = fma(m, s_x, acc)) in block
 * order, one float lane per (row, token). Two blocks per vector as in tile32 above; the integer
 * sums of all of a tile's (row, token) elements and both blocks come out of one reduction
 * (reduce_pairs), the rows' scales of both blocks from the blocks' first words (block_words),
 * and each block then costs one 8-lane fma (two for the offset types) for the whole tile; one
 * token's tile takes 8 rows (CB_TILE_R1). vpdpbusd makes the integers (hence VNNI only: without
 * it the AVX2 invariant tiles run). */

/* v[k] (k < K <= 8): 16 int32 lanes each, [8 of block b | 8 of block b+1]. Returns lane k = the
 * sum of v[k]'s block-b lanes, lane 8 + k = the sum of its block-b+1 lanes (lanes k >= K:
 * anything). */
INL __m512i reduce_pairs(const __m512i *v, int K) {
    __m512i a[4];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        if (2 * i >= K) {
            a[i] = a[0];
            continue;
        }
        __m512i x = v[2 * i], y = 2 * i + 1 < K ? v[2 * i + 1] : x;
        /* per 128-bit lane: [x0+x2, y0+y2, x1+x3, y1+y3] */
        a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
    }
    /* per 128-bit lane: the lane's sums of v[0..3] (b0) and v[4..7] (b1) */
    __m512i b0 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
    __m512i b1 = K > 4 ? _mm512_add_epi32(_mm512_unpacklo_epi64(a[2], a[3]),
                                          _mm512_unpackhi_epi64(a[2], a[3]))
                       : b0;
    /* 128-bit lanes 0+1 are block b, 2+3 block b+1: [b: v0..3, b+1: v0..3, b: v4..7, b+1: v4..7] */
    __m512i g = _mm512_add_epi32(_mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_shuffle_i32x4(g, g, _MM_SHUFFLE(3, 1, 2, 0));
}

/* 16 lanes: lane k < 8 = lo[k % NT], lane 8 + k = hi[k % NT] (a token's value for each (row,
 * token) lane k = r * NT + t of the tile) */
INL __m512 lanes_ps(const float *lo, const float *hi, int NT) {
    if (NT == 1) return join_ps(_mm256_set1_ps(lo[0]), _mm256_set1_ps(hi[0]));
    return _mm512_setr_ps(lo[0], lo[1 % NT], lo[2 % NT], lo[3 % NT], lo[4 % NT], lo[5 % NT],
                          lo[6 % NT], lo[7 % NT], hi[0], hi[1 % NT], hi[2 % NT], hi[3 % NT],
                          hi[4 % NT], hi[5 % NT], hi[6 % NT], hi[7 % NT]);
}

INL __m512i lanes_epi32(const int32_t *lo, const int32_t *hi, int NT) {
    if (NT == 1) return join_si(_mm256_set1_epi32(lo[0]), _mm256_set1_epi32(hi[0]));
    return _mm512_setr_epi32(lo[0], lo[1 % NT], lo[2 % NT], lo[3 % NT], lo[4 % NT], lo[5 % NT],
                             lo[6 % NT], lo[7 % NT], hi[0], hi[1 % NT], hi[2 % NT], hi[3 % NT],
                             hi[4 % NT], hi[5 % NT], hi[6 % NT], hi[7 % NT]);
}

/* The 16-bit words at offset off of the tile's blocks (byte: the bytes, zero-extended), as 16
 * lanes [block b | block b+1]: lane k (and 8 + k) of row k / NT; lanes k >= K: row 0's, and
 * lanes 4..7 repeat 0..3 when K <= 4. bw points at row 0's block b; hi = 0: no block b+1 (its
 * lanes repeat block b). Packed in general registers, four lanes a word: the vector units are
 * the tile's bottleneck (vpgatherdd, tried first, halved the tile's speed). */
INL __m256i block_words(const uint8_t *bw, size_t ws, size_t bb, int NT, int K, int hi, int off,
                        int byte) {
    uint64_t q[4];
    #pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        if ((g & 1) && K <= 4) { /* lanes 4..7 unused: a copy keeps them normal floats (a zero
                                  * e8m0 byte is a denormal scale: a microcode assist per fma) */
            q[g] = q[g - 1];
            continue;
        }
        q[g] = 0;
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            int k = (g & 1) * 4 + j;
            const uint8_t *p = bw + (size_t)(k < K ? k / NT : 0) * ws + (g >= 2 && hi ? bb : 0) + off;
            q[g] |= (uint64_t)(byte ? p[0] : cb_rd16(p)) << (16 * j);
        }
    }
    return _mm256_setr_epi64x((long long)q[0], (long long)q[1], (long long)q[2], (long long)q[3]);
}

/* One token's block_words of a pair of blocks (hi = 1, type not MXFP4): word o and word
 * o + bb/2 of rows 0..7 (rows >= NR: row 0's) as lanes [block b | block b+1], from one masked
 * load a row and a tree of seven two-source word permutes instead of 16 scalar loads and the
 * shifts that pack them (Q8_0 expert-sized matvecs from memory ~6% faster, see the commit). */
INL __m256i pair_words(const uint8_t *bw, size_t ws, int NR, size_t bb, int o) {
    const int h = (int)(bb / 2) + o; /* block b+1's word */
    const __mmask32 m = (__mmask32)((1u << (h + 1)) - 1u);
    static const int16_t k2[32] = {0, 1, 32, 33, 0, 0, 0, 0, 8, 9, 40, 41};
    static const int16_t k3[32] = {0, 1, 2, 3, 32, 33, 34, 35, 8, 9, 10, 11, 40, 41, 42, 43};
    int16_t k1[32] = {0};
    k1[0] = (int16_t)o;
    k1[1] = (int16_t)(32 + o);
    k1[8] = (int16_t)h;
    k1[9] = (int16_t)(32 + h);
    const __m512i i1 = loadu512(k1), i2 = loadu512(k2), i3 = loadu512(k3);
    __m512i p[4];
    #pragma GCC unroll 4
    for (int r = 0; r < 8; r += 2) {
        const __m512i a = _mm512_maskz_loadu_epi16(m, bw + (size_t)(r < NR ? r : 0) * ws);
        const __m512i b = _mm512_maskz_loadu_epi16(m, bw + (size_t)(r + 1 < NR ? r + 1 : 0) * ws);
        p[r / 2] = _mm512_permutex2var_epi16(a, i1, b);
    }
    const __m512i q0 = _mm512_permutex2var_epi16(p[0], i2, p[1]);
    const __m512i q1 = _mm512_permutex2var_epi16(p[2], i2, p[3]);
    return _mm512_castsi512_si256(_mm512_permutex2var_epi16(q0, i3, q1));
}

/* the blocks' scales d from their words (f16; MXFP4: the e8m0 byte, halved as cb_e8m0_half) */
INL __m512 word_scales(int type, __m256i h) {
    if (type != CB_TYPE_MXFP4) return _mm512_cvtph_ps(h);
    const __m512i e = _mm512_cvtepu16_epi32(h);
    const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __m512i nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(
        _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(2), e), nrm, sub));
}

/* Blocks p0 and p1 as 64 unsigned bytes for vpdpbusd: unpack64's, and the signed types (Q8_0,
 * MXFP4) offset by 128 (an exclusive or: two's complement to excess-128), so that their sums
 * are sum((q + 128) * x) - 128 * isum: one operation per row instead of vpabsb and a sign
 * flip of the activations. */
INL __m512i unpack64u(int type, const uint8_t *p0, const uint8_t *p1) {
    switch (type) {
    case CB_TYPE_Q8_0:
        return _mm512_xor_si512(join_si(loadu256(p0 + 2), p1 ? loadu256(p1 + 2) : _mm256_setzero_si256()),
                                _mm512_set1_epi8((char)0x80));
    case CB_TYPE_MXFP4: {
        const __m512i table = _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)cb_mxfp4_values)),
            _mm512_set1_epi8((char)0x80));
        return _mm512_shuffle_epi8(table, nibbles2(p0 + 1, p1 ? p1 + 1 : NULL));
    }
    default: return unpack64(type, p0, p1);
    }
}

INLV void tile32i(int type, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const int offset = type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1;
    /* log2 of the zero point taken out of the unsigned sums (none for the offset types) */
    const int zsh = type == CB_TYPE_Q4_0 ? 3 : (type == CB_TYPE_Q5_0 ? 4 : (offset ? 0 : 7));
    const int K = NR * NT;
    const size_t bb = bytes32(type);
    __m256 vacc = _mm256_setzero_ps(); /* lanes k = r * NT + t */
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb; /* an odd last block runs alone in the low half */
        const uint8_t *bw = w + (size_t)b * bb;
        float dx0[4], dx1[4], sx0[4] = {0}, sx1[4] = {0};
        int32_t zx0[4], zx1[4];
        __m512i xv[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
            xv[t] = join_si(loadu256(a[0].qs), two ? loadu256(a[1].qs) : _mm256_setzero_si256());
            dx0[t] = a[0].d;
            dx1[t] = two ? a[1].d : 0.0f;
            zx0[t] = a[0].isum;
            zx1[t] = two ? a[1].isum : 0;
            if (offset) {
                sx0[t] = a[0].s;
                sx1[t] = two ? a[1].s : 0.0f;
            }
        }
        __m512i pv[8];
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *p0 = bw + (size_t)r * ws;
            prefetch_span(p0 + (size_t)NR * CB_DEC_PF512 * ws, two ? 2 * bb : bb);
            const __m512i wq = unpack64u(type, p0, two ? p0 + bb : NULL);
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                pv[r * NT + t] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xv[t]);
        }
        __m512i s = reduce_pairs(pv, K);
        if (zsh) s = _mm512_sub_epi32(s, _mm512_slli_epi32(lanes_epi32(zx0, zx1, NT), zsh));
        const __m512 f = _mm512_cvtepi32_ps(s);
        const int pw = NT == 1 && two && type != CB_TYPE_MXFP4;
        const __m256i dw = pw ? pair_words(bw, ws, NR, bb, 0)
                              : block_words(bw, ws, bb, NT, K, two, 0, type == CB_TYPE_MXFP4);
        const __m512 sc = _mm512_mul_ps(word_scales(type, dw), lanes_ps(dx0, dx1, NT));
        __m512 m = _mm512_setzero_ps(), sxv = _mm512_setzero_ps();
        if (offset) {
            m = _mm512_cvtph_ps(pw ? pair_words(bw, ws, NR, bb, 1)
                                   : block_words(bw, ws, bb, NT, K, two, 2, 0));
            sxv = lanes_ps(sx0, sx1, NT);
        }
        vacc = _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm512_castps512_ps256(sc), vacc);
        if (offset) vacc = _mm256_fmadd_ps(_mm512_castps512_ps256(m), _mm512_castps512_ps256(sxv), vacc);
        if (two) {
            vacc = _mm256_fmadd_ps(hi_ps(f), hi_ps(sc), vacc);
            if (offset) vacc = _mm256_fmadd_ps(hi_ps(m), hi_ps(sxv), vacc);
        }
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, vacc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = tmp[r * NT + t];
}

/* I4_G128 against cb_q8a_t: a half group (32 bytes) unpacks to activation blocks b, b+1. */
INL void tile_i4(int unused, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                 const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)unused;
    const __m512i ones = _mm512_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m512 acc[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        __m512i wq[2];
        __m512 dw[2];
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)(b >> 2) * 66;
            if ((b & 3) == 0) prefetch_span(blk + (size_t)NR * ws, 66);
            __m256i v = loadu256(blk + 2 + 16 * (b & 3));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            /* byte i -> values 2i (low nibble), 2i+1 (high): per 128-bit lane, then lanes in order */
            __m512i z = join_si(_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
            wq[r] = _mm512_shuffle_i32x4(z, z, 0xD8);
            dw[r] = _mm512_set1_ps(CB_F16(blk));
        }
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)(x + (size_t)t * xs) + b;
            const __m512i xv = join_si(loadu256(a[0].qs), loadu256(a[1].qs));
            const __m512i zs = join_si(_mm256_set1_epi32(a[0].isum), _mm256_set1_epi32(a[1].isum));
            const __m512 dx = join_ps(_mm256_set1_ps(a[0].d), _mm256_set1_ps(a[1].d));
            #pragma GCC unroll 8
            for (int r = 0; r < NR; r++) {
                /* unsigned q times x, minus 8*isum spread over each block's 8 lanes */
                __m512i p = _mm512_sub_epi32(
                    _mm512_madd_epi16(_mm512_maddubs_epi16(wq[r], xv), ones), zs);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[r], dx),
                                            acc[r][t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = hsum_ps(acc[r][t]);
}

/* ------------------------------------------------------------ float weights */

INL __m512 load16(int type, const uint8_t *p) {
    if (type == CB_TYPE_F32) return _mm512_loadu_ps((const float *)(const void *)p);
    __m256i h = loadu256(p);
    if (type == CB_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INL float load1(int type, const uint8_t *p) {
    if (type == CB_TYPE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    return type == CB_TYPE_F16 ? CB_F16(p) : cb_bf16_to_f32(cb_rd16(p));
}

INL void tile_float(int type, int NR, int NT, int64_t n, const uint8_t *w, size_t ws,
                    const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const size_t es = type == CB_TYPE_F32 ? 4 : 2;
    __m512 acc[2][4];
    #pragma GCC unroll 8
    for (int r = 0; r < NR; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        #pragma GCC unroll 8
        for (int r = 0; r < NR; r++) {
            __m512 wv = load16(type, w + (size_t)r * ws + (size_t)c * es);
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                acc[r][t] = _mm512_fmadd_ps(
                    wv, _mm512_loadu_ps((const float *)(const void *)(x + (size_t)t * xs) + c),
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
/* CB_DEFINE_TILE (quant_avx512_impl.h) makes a cb_tile_fn of a tile body; the K-quants' are in
 * quant_avx512_k.c. */

CB_DEFINE_TILE(tile512_q4_0, tile32, CB_TYPE_Q4_0)
CB_DEFINE_TILE(tile512_q4_1, tile32, CB_TYPE_Q4_1)
CB_DEFINE_TILE(tile512_q5_0, tile32, CB_TYPE_Q5_0)
CB_DEFINE_TILE(tile512_q5_1, tile32, CB_TYPE_Q5_1)
CB_DEFINE_TILE(tile512_q8_0, tile32, CB_TYPE_Q8_0)
CB_DEFINE_TILE(tile512_mxfp4, tile32, CB_TYPE_MXFP4)
CB_DEFINE_TILE(tile512_i4g128, tile_i4, 0)
CB_DEFINE_TILE4(tile512i_q4_0, tile32i, CB_TYPE_Q4_0, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE4(tile512i_q4_1, tile32i, CB_TYPE_Q4_1, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE4(tile512i_q5_0, tile32i, CB_TYPE_Q5_0, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE4(tile512i_q5_1, tile32i, CB_TYPE_Q5_1, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE4(tile512i_q8_0, tile32i, CB_TYPE_Q8_0, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE4(tile512i_mxfp4, tile32i, CB_TYPE_MXFP4, CB_AVX512_VNNI_TARGET, 8)
CB_DEFINE_TILE(tile512_f32, tile_float, CB_TYPE_F32)
CB_DEFINE_TILE(tile512_f16, tile_float, CB_TYPE_F16)
CB_DEFINE_TILE(tile512_bf16, tile_float, CB_TYPE_BF16)

cb_tile_fn CB_AVX512_FN(tile)(int type) {
    switch (type) {
    case CB_TYPE_F32: return tile512_f32;
    case CB_TYPE_F16: return tile512_f16;
    case CB_TYPE_BF16: return tile512_bf16;
    case CB_TYPE_Q4_0: return tile512_q4_0;
    case CB_TYPE_Q4_1: return tile512_q4_1;
    case CB_TYPE_Q5_0: return tile512_q5_0;
    case CB_TYPE_Q5_1: return tile512_q5_1;
    case CB_TYPE_Q8_0: return tile512_q8_0;
    case CB_TYPE_MXFP4: return tile512_mxfp4;
    case CB_TYPE_I4_G128: return tile512_i4g128;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return CB_AVX512_FN(k_tile)(type);
    default: return NULL;
    }
}

/* The direct tiles that sum in the packed tiles' order (batch invariant): the K-quants'
 * (quant_avx512_k.c) and, with VNNI (vnni != 0), the 32-block types' (tile32i); NULL for the
 * others, whose tiles above sum in lanes (fast only). */
cb_tile_fn CB_AVX512_FN(tile_invariant)(int type, int vnni) {
    switch (type) {
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return vnni ? CB_AVX512_FN(k_tile_vnni)(type) : CB_AVX512_FN(k_tile)(type);
    case CB_TYPE_Q4_0: return vnni ? tile512i_q4_0 : NULL;
    case CB_TYPE_Q4_1: return vnni ? tile512i_q4_1 : NULL;
    case CB_TYPE_Q5_0: return vnni ? tile512i_q5_0 : NULL;
    case CB_TYPE_Q5_1: return vnni ? tile512i_q5_1 : NULL;
    case CB_TYPE_Q8_0: return vnni ? tile512i_q8_0 : NULL;
    case CB_TYPE_MXFP4: return vnni ? tile512i_mxfp4 : NULL;
    default: return NULL;
    }
}

/* ------------------------------------------------------------ packed rows (matmul)
 *
 * The groups come from cb_avx2_rp_pack (quant_avx2.c; layout described there): per block of 32
 * values, 8 vectors of 32 bytes (step s: values 4s..4s+3 of rows 0..7), then d[8] (and m[8]).
 * Here one 512-bit load takes steps s and s+1; the token's 32 activation bytes of the block,
 * loaded once, give [word s x 8 | word s+1 x 8] with one vpermd. Each int16 lane then holds
 * one step per pair of steps, so the int16 overflow bound per lane (rp_steps steps) holds with
 * up to rp_steps pairs between widenings; the two int32 halves are added per block (the AVX2
 * kernel's exact integer sums), then scaled in float on 8 lanes = 8 rows. */

INL int rp_has_m(int type) { return type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1; }

INL int rp_steps(int type) { /* as quant_avx2.c: G*2*qmax*127 <= 32767 */
    switch (type) {
    case CB_TYPE_Q4_0:
    case CB_TYPE_Q4_1:
    case CB_TYPE_I4_G128: return 8;
    case CB_TYPE_Q8_0: return 1;
    default: return 4;
    }
}

INL size_t rp_bstride(int type) { return 256 + 32 + (rp_has_m(type) ? 32 : 0); }

INL void rp_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                 float *out) {
    const int G = rp_steps(type) < 4 ? rp_steps(type) : 4, z = rp_z(type), hm = rp_has_m(type);
    const int sgn = type == CB_TYPE_Q8_0;
    const size_t bst = rp_bstride(type);
    const int64_t cols = nb * CB_QK;
    const __m512i ones = _mm512_set1_epi16(1);
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
        __m512i xb32[4], iacc[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) xb32[t] = zext_si(loadu256(xq[t] + 32 * b));
        #pragma GCC unroll 4
        for (int g0 = 0; g0 < 4; g0 += G) {
            __m512i a16[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) a16[t] = _mm512_setzero_si512();
            #pragma GCC unroll 1
            for (int p = g0; p < g0 + G; p++) {
                __m512i wv = loadu512(q + 64 * p);
                __m512i aw = sgn ? _mm512_abs_epi8(wv) : wv;
                __m512i idx = pair_idx(p);
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    __m512i xb = _mm512_permutexvar_epi32(idx, xb32[t]);
                    if (sgn) xb = sign_by(xb, wv);
                    a16[t] = _mm512_add_epi16(a16[t], _mm512_maddubs_epi16(aw, xb));
                }
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i p = _mm512_madd_epi16(a16[t], ones);
                iacc[t] = g0 == 0 ? p : _mm512_add_epi32(iacc[t], p);
            }
        }
        const __m256 dv = _mm256_loadu_ps((const float *)(const void *)(q + 256));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = fold_epi32(iacc[t]);
            __m256i p = z ? _mm256_sub_epi32(s, _mm256_set1_epi32(zi[t][b])) : s;
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                      _mm256_mul_ps(dv, _mm256_set1_ps(dx[t][b])), facc[t]);
            if (hm)
                facc[t] = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(q + 288)),
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

/* The same tile with AVX512-VNNI (cb_cpu_level() == CB_SIMD_AVX512_VNNI): vpdpbusd multiplies
 * the unsigned weight bytes by the signed activation bytes and adds each lane's 4 products into
 * its int32 lane, so the block's four pairs of steps accumulate in int32 with one instruction
 * per token and pair (the tile above: maddubs, add, then madd to widen). Q8_0's signed weights
 * become unsigned by flipping the sign bit (w + 128, one xor per vector shared by the tokens) and
 * the 128 * sum(x) this adds is taken out with the activation's z*isum (cb_rp_act_z(Q8_0) = 128).
 * No intermediate can overflow, so the integer block sums, and then every float operation, are
 * those of the tile above and of the AVX2 kernels: bit-identical results (batch invariance). */
INLV void rpv_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                   float *out) {
    const int hm = rp_has_m(type), sgn = type == CB_TYPE_Q8_0;
    const int z = sgn ? 128 : rp_z(type);
    const size_t bst = rp_bstride(type);
    const int64_t cols = nb * CB_QK;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
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
        __m512i xb32[4], iacc[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            xb32[t] = zext_si(loadu256(xq[t] + 32 * b));
            iacc[t] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m512i wv = loadu512(q + 64 * p);
            if (sgn) wv = _mm512_xor_si512(wv, flip);
            __m512i idx = pair_idx(p);
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                iacc[t] = _mm512_dpbusd_epi32(iacc[t], wv,
                                              _mm512_permutexvar_epi32(idx, xb32[t]));
        }
        const __m256 dv = _mm256_loadu_ps((const float *)(const void *)(q + 256));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            __m256i s = fold_epi32(iacc[t]);
            __m256i p = z ? _mm256_sub_epi32(s, _mm256_set1_epi32(zi[t][b])) : s;
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                      _mm256_mul_ps(dv, _mm256_set1_ps(dx[t][b])), facc[t]);
            if (hm)
                facc[t] = _mm256_fmadd_ps(_mm256_loadu_ps((const float *)(const void *)(q + 288)),
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

/* The VNNI tile on 16-row groups (cb_avx2_rp16_pack, quant_avx2.c): a 512-bit vector holds one
 * step (4 values) of 16 rows, so a token's 4 activation bytes are one broadcast load and each
 * vpdpbusd serves 16 rows x 4 values with no permute, and no fold of halves afterwards (the
 * 8-row tile above: a vpermd per token and pair of steps, then the halves added). Per lane (row)
 * the block sum is the same exact integer and the float operations are the same, in the same
 * order: bit-identical to the 8-row tiles. out[r * NT + t], r < 16 (rows past nr: 0). */
INLV void rpv16_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                     size_t xs, float *out) {
    const int hm = rp_has_m(type), sgn = type == CB_TYPE_Q8_0;
    const int z = sgn ? 128 : rp_z(type);
    const size_t bst = cb_rp16_bstride(type);
    const int64_t cols = nb * CB_QK;
    const uint8_t *xq[8];
    const float *dx[8], *sx[8];
    const int32_t *zi[8];
    __m512 facc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        xq[t] = xa + (size_t)t * xs;
        dx[t] = (const float *)(const void *)(xq[t] + cols);
        zi[t] = (const int32_t *)(const void *)(dx[t] + nb);
        sx[t] = (const float *)(const void *)(zi[t] + nb);
        facc[t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst;
        __m512i iacc[8];
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) iacc[t] = _mm512_setzero_si512();
        #pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            __m512i wv = loadu512(q + 64 * s);
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++)
                iacc[t] = _mm512_dpbusd_epi32(iacc[t], wv,
                                              _mm512_set1_epi32(rd_i32(xq[t] + 32 * b + 4 * s)));
        }
        const __m512 dv = _mm512_loadu_ps((const float *)(const void *)(q + 512));
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m512i p = z ? _mm512_sub_epi32(iacc[t], _mm512_set1_epi32(zi[t][b])) : iacc[t];
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                      _mm512_mul_ps(dv, _mm512_set1_ps(dx[t][b])), facc[t]);
            if (hm)
                facc[t] = _mm512_fmadd_ps(_mm512_loadu_ps((const float *)(const void *)(q + 576)),
                                          _mm512_set1_ps(sx[t][b]), facc[t]);
        }
    }
    store16(facc, NT, out);
}

/* NAME(pk, nb, xa, xs, nt, out): the 16-row TILE(ARG, nt, ...) for nt <= 8 tokens, each count
 * its own instance (the tiles unroll over the tokens) */
#define CB_DEFINE_NT8(NAME, TILE, ARG)                                                          \
    CB_AVX512_VNNI_TARGET static void NAME(const uint8_t *pk, int64_t nb, const uint8_t *xa,   \
                                           size_t xs, int nt, float *out) {                    \
        switch (nt) {                                                                           \
        case 1: TILE(ARG, 1, pk, nb, xa, xs, out); break;                                       \
        case 2: TILE(ARG, 2, pk, nb, xa, xs, out); break;                                       \
        case 3: TILE(ARG, 3, pk, nb, xa, xs, out); break;                                       \
        case 4: TILE(ARG, 4, pk, nb, xa, xs, out); break;                                       \
        case 5: TILE(ARG, 5, pk, nb, xa, xs, out); break;                                       \
        case 6: TILE(ARG, 6, pk, nb, xa, xs, out); break;                                       \
        case 7: TILE(ARG, 7, pk, nb, xa, xs, out); break;                                       \
        default: TILE(ARG, 8, pk, nb, xa, xs, out); break;                                      \
        }                                                                                       \
    }
#define CB_DEFINE_RPV16(NAME, TYPE) CB_DEFINE_NT8(NAME, rpv16_tile, TYPE)
CB_DEFINE_RPV16(rpv16_q4_0, CB_TYPE_Q4_0)
CB_DEFINE_RPV16(rpv16_q4_1, CB_TYPE_Q4_1)
CB_DEFINE_RPV16(rpv16_q5_0, CB_TYPE_Q5_0)
CB_DEFINE_RPV16(rpv16_q5_1, CB_TYPE_Q5_1)
CB_DEFINE_RPV16(rpv16_q8_0, CB_TYPE_Q8_0)
CB_DEFINE_RPV16(rpv16_mxfp4, CB_TYPE_MXFP4)
CB_DEFINE_RPV16(rpv16_i4g128, CB_TYPE_I4_G128)

/* CB_DEFINE_RP and CB_DEFINE_RPV: quant_avx512_impl.h */
CB_DEFINE_RPV(rpv512_q4_0, rpv_tile, CB_TYPE_Q4_0)
CB_DEFINE_RPV(rpv512_q4_1, rpv_tile, CB_TYPE_Q4_1)
CB_DEFINE_RPV(rpv512_q5_0, rpv_tile, CB_TYPE_Q5_0)
CB_DEFINE_RPV(rpv512_q5_1, rpv_tile, CB_TYPE_Q5_1)
CB_DEFINE_RPV(rpv512_q8_0, rpv_tile, CB_TYPE_Q8_0)
CB_DEFINE_RPV(rpv512_mxfp4, rpv_tile, CB_TYPE_MXFP4)
CB_DEFINE_RPV(rpv512_i4g128, rpv_tile, CB_TYPE_I4_G128)

CB_DEFINE_RP(rp512_q4_0, rp_tile, CB_TYPE_Q4_0)
CB_DEFINE_RP(rp512_q4_1, rp_tile, CB_TYPE_Q4_1)
CB_DEFINE_RP(rp512_q5_0, rp_tile, CB_TYPE_Q5_0)
CB_DEFINE_RP(rp512_q5_1, rp_tile, CB_TYPE_Q5_1)
CB_DEFINE_RP(rp512_q8_0, rp_tile, CB_TYPE_Q8_0)
CB_DEFINE_RP(rp512_mxfp4, rp_tile, CB_TYPE_MXFP4)
CB_DEFINE_RP(rp512_i4g128, rp_tile, CB_TYPE_I4_G128)

void CB_AVX512_FN(rp_tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                           int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_0: rp512_q4_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_1: rp512_q4_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_0: rp512_q5_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_1: rp512_q5_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q8_0: rp512_q8_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_MXFP4: rp512_mxfp4(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_I4_G128: rp512_i4g128(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: CB_AVX512_FN(k_rp_tile)(type, pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

void CB_AVX512_FN(rp_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                size_t xs, int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_0: rpv512_q4_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_1: rpv512_q4_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_0: rpv512_q5_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_1: rpv512_q5_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q8_0: rpv512_q8_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_MXFP4: rpv512_mxfp4(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_I4_G128: rpv512_i4g128(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: CB_AVX512_FN(k_rp_tile_vnni)(type, pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

void CB_AVX512_FN(rp16_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_0: rpv16_q4_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_1: rpv16_q4_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_0: rpv16_q5_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_1: rpv16_q5_1(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q8_0: rpv16_q8_0(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_MXFP4: rpv16_mxfp4(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_I4_G128: rpv16_i4g128(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: CB_AVX512_FN(k_rp16_tile_vnni)(type, pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

/* The R16 layouts (Q8_0_R16, Q5_0_R16: include/colibri/quant.h, quant_r16.c): 16 weight rows
 * per vector as in rpv16_tile, but read in place from the matrix (no packing per call) and
 * scaled by f16 d. Q8_0_R16 steps are the vpdpbusd operands as stored; Q5_0_R16 rebuilds them
 * from nibble pairs (steps v and v + 4 in one vector) and a 64-bit mask of fifth bits per step.
 * Per row and block: the exact sum(q' * x) less z * isum (q' = q + 128 or the unsigned 5-bit q;
 * z = 128 or 16, the activations' zi), then fma((float)isum, d * d_x, acc) in block order: the
 * float operations of the invariant Q8_0 / Q5_0 tiles, so the same results. out[r * NT + t]. */
#ifndef CB_R16_PF
#define CB_R16_PF 24
#endif
INLV void r16_tile(int layout, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                   size_t xs, float *out) {
    const int q8 = layout == CB_TYPE_Q8_0_R16;
    const size_t bst = q8 ? 544 : 352;
    const int64_t cols = nb * CB_QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10);
    const uint8_t *xq[8];
    const float *dx[8];
    const int32_t *zi[8];
    __m512 facc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        xq[t] = xa + (size_t)t * xs;
        dx[t] = (const float *)(const void *)(xq[t] + cols);
        zi[t] = (const int32_t *)(const void *)(dx[t] + nb);
        facc[t] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst;
        __m512i iacc[8];
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) iacc[t] = _mm512_setzero_si512();
        #pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            if (!q8 && NT > 1) { /* Q5_0 token tiles: the block CB_R16_PF ahead, spread over the
                                  * steps (Q8_0 streams faster without, and so does one token's
                                  * Q5_0 tile: the hardware prefetchers keep up; r16k_tile) */
                cb_prefetch_l2(q + CB_R16_PF * bst + 64 * v);
                if (v < 2) cb_prefetch_l2(q + CB_R16_PF * bst + 256 + 64 * v);
            }
            __m512i w0, w1; /* steps v and v + 4 */
            if (q8) {
                w0 = loadu512(q + 64 * v);
                w1 = loadu512(q + 64 * (v + 4));
            } else {
                const __m512i raw = loadu512(q + 64 * v);
                uint64_t k0, k1;
                memcpy(&k0, q + 256 + 8 * v, 8);
                memcpy(&k1, q + 256 + 8 * (v + 4), 8);
                w0 = _mm512_and_si512(raw, m4);
                w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                w0 = _mm512_mask_add_epi8(w0, (__mmask64)k0, w0, b4);
                w1 = _mm512_mask_add_epi8(w1, (__mmask64)k1, w1, b4);
            }
            #pragma GCC unroll 8
            for (int t = 0; t < NT; t++) {
                const uint8_t *xb = xq[t] + 32 * b;
                iacc[t] = _mm512_dpbusd_epi32(iacc[t], w0, _mm512_set1_epi32(rd_i32(xb + 4 * v)));
                iacc[t] = _mm512_dpbusd_epi32(iacc[t], w1, _mm512_set1_epi32(rd_i32(xb + 4 * (v + 4))));
            }
        }
        const __m512 dv = _mm512_cvtph_ps(loadu256(q + bst - 32));
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            __m512i p = _mm512_sub_epi32(iacc[t], _mm512_set1_epi32(zi[t][b]));
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                      _mm512_mul_ps(dv, _mm512_set1_ps(dx[t][b])), facc[t]);
        }
    }
    store16(facc, NT, out);
}

CB_DEFINE_NT8(r16_q8_0, r16_tile, CB_TYPE_Q8_0_R16)
CB_DEFINE_NT8(r16_q5_0, r16_tile, CB_TYPE_Q5_0_R16)

void CB_AVX512_FN(r16_tile_vnni)(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                 size_t xs, int nt, float *out) {
    if (layout == CB_TYPE_Q8_0_R16)
        r16_q8_0(pk, nb, xa, xs, nt, out);
    else if (layout == CB_TYPE_Q5_0_R16)
        r16_q5_0(pk, nb, xa, xs, nt, out);
    else
        CB_AVX512_FN(r16k_tile_vnni)(layout, pk, nb, xa, xs, nt, out);
}

#else
/* Not x86-64 GCC/Clang: no AVX-512 kernels (cb_cpu_level() is scalar there). */
cb_tile_fn CB_AVX512_FN(tile)(int type) {
    (void)type;
    return NULL;
}
cb_tile_fn CB_AVX512_FN(tile_invariant)(int type, int vnni) {
    (void)type;
    (void)vnni;
    return NULL;
}
void CB_AVX512_FN(quantize_q8a)(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
void CB_AVX512_FN(quantize_q8k)(const float *x, int64_t n, void *dst) { (void)x; (void)n; (void)dst; }
void CB_AVX512_FN(rp_quantize)(int type, const float *x, int64_t cols, uint8_t *dst) {
    (void)type; (void)x; (void)cols; (void)dst;
}
void CB_AVX512_FN(rp_tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                           int nt, float *out) {
    (void)type; (void)pk; (void)nb; (void)xa; (void)xs; (void)nt; (void)out;
}
void CB_AVX512_FN(rp_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                           int nt, float *out) {
    (void)type; (void)pk; (void)nb; (void)xa; (void)xs; (void)nt; (void)out;
}
void CB_AVX512_FN(rp16_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out) {
    (void)type; (void)pk; (void)nb; (void)xa; (void)xs; (void)nt; (void)out;
}
void CB_AVX512_FN(r16_tile_vnni)(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                 size_t xs, int nt, float *out) {
    (void)layout; (void)pk; (void)nb; (void)xa; (void)xs; (void)nt; (void)out;
}
#endif
