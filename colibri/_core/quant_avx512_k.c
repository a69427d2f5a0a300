/* AVX-512 (F, BW, DQ, VL; + FMA, F16C; VNNI in the *_vnni tile) kernels of the K-quants (Q4_K,
 * Q5_K, Q6_K: super-blocks of 256 values, activations as cb_q8k_t) for quant.c: the
 * register-tiled dot products and the packed-row tiles (on cb_avx2_rp_pack's groups).
 * quant_avx512.c's opening comment describes what 512 bits change against quant_avx2.c and the
 * emulated build (tests/c/test_quant_avx512.c includes this file too); it dispatches here through
 * CB_AVX512_FN(k_tile), CB_AVX512_FN(k_rp_tile) and CB_AVX512_FN(k_rp_tile_vnni). The math is the
 * scalar kernels' (quant.c): exact int32 sums of q*x per sub-block scaled by the sub-block
 * scales in the integers, then d*dx (and dmin*dx against the bsums for the mins) in float; the
 * packed-row tiles' integer block sums are the AVX2 ones, bit for bit.
 * Ownership: every pointer is borrowed for one call; nothing is allocated.
 */
#include "quant_avx512_impl.h"

#if CB_AVX512_ON

/* ------------------------------------------------------------ K-quants with cb_q8k_t */

/* The direct tiles of the K-quants, batch invariant: per super-block and (row, token) the exact
 * int32 sum of sc_j * q * x (and of the mins against the bsums), then, in float, the AVX2
 * invariant tiles' order (quant_avx2_k.c): acc = fma(isum, d*dx, acc), acc = fnmadd(mins,
 * dmin*dx, acc) (Q6_K: the zero point 32 in the integers), one float lane per (row, token). The
 * integers are the same whatever the SIMD width, so the outputs are those of the AVX2 invariant
 * tile and of the packed tiles bit for bit; 512 bits only halve the instructions that make the
 * integers (Q4_K 768x2048, 1 token, 1 thread: see the commit). */

/* Lane k (k < K <= 8) = the sum of the 8 int32 lanes of v[k]; lanes past K: anything. */
INL __m256i reduce8_epi32(const __m256i *v, int K) {
    __m256i h01 = _mm256_hadd_epi32(v[0], K > 1 ? v[1] : v[0]);
    __m256i h23 = _mm256_hadd_epi32(K > 2 ? v[2] : v[0], K > 3 ? v[3] : v[0]);
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
INL __m256 set8_ps(const float *a) { return _mm256_setr_ps(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]); }

/* Word index of vector k's int16 scales in tile_q4k: [sub-block lo(k) x 16 | hi(k) x 16], the
 * sub-blocks of [low nibbles of chunk 2(k/2) | of chunk 2(k/2)+1] (k even) or the high nibbles. */
INL __m512i q4k_sidx(int k) {
    int lo = 4 * (k / 2) + (k & 1);
    return join_si(_mm256_set1_epi16((short)lo), _mm256_set1_epi16((short)(lo + 2)));
}

/* Q5_K: vector k of the nibble layout below (sub-blocks [lo | lo + 2], lo = 4 (k / 2) + k % 2)
 * with its fifth bits ORed in: bit j of qh[l] (qh's 32 bytes in both halves) is the fifth bit of
 * sub-block j's value l. */
INL __m512i q5k_fifth_bits(__m512i w, __m512i qh, int k) {
    const int lo = 4 * (k / 2) + (k & 1);
    const __m512i bit = join_si(_mm256_set1_epi8((char)(1 << lo)), _mm256_set1_epi8((char)(1 << (lo + 2))));
    return _mm512_or_si512(w, _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, bit), _mm512_set1_epi8(0x10)));
}

/* Q4_K/Q5_K: the 128 qs bytes as two 64-byte vectors Z0, Z1 (chunks 0|1, 2|3 of 32 bytes; chunk
 * c holds sub-block 2c in its low nibbles, 2c+1 in its high): W0 = low nibbles of Z0 =
 * sub-blocks [0 | 2], W1 = its high nibbles = [1 | 3], W2 = [4 | 6], W3 = [5 | 7]. The
 * activations meet them as [x 0..31 | x 64..95] etc.: one 128-bit-lane shuffle per vector,
 * made once per token and block for all rows of the tile. */
INL void tile_q4k(int q5, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    const size_t bb = q5 ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m256 vacc = _mm256_setzero_ps(); /* lanes k = r * NT + t */
    for (int64_t b = 0; b < nb; b++) {
        __m512i xa[4][4];
        float dx[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
            dx[t] = a->d;
            __m512i x0 = loadu512(a->qs), x1 = loadu512(a->qs + 64);
            __m512i x2 = loadu512(a->qs + 128), x3 = loadu512(a->qs + 192);
            xa[t][0] = _mm512_shuffle_i64x2(x0, x1, 0x44); /* x 0..31 | 64..95 */
            xa[t][1] = _mm512_shuffle_i64x2(x0, x1, 0xEE); /* x 32..63 | 96..127 */
            xa[t][2] = _mm512_shuffle_i64x2(x2, x3, 0x44);
            xa[t][3] = _mm512_shuffle_i64x2(x2, x3, 0xEE);
        }
        __m256i pv[8], mv[8];
        float scd[8] = {0}, smn[8] = {0};
        uint64_t dw = 0, dmw = 0; /* one token: the rows' f16 d and dmin, four words each */
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * bb;
            if (NT == 1) {
                dw |= (uint64_t)cb_rd16(blk) << (16 * r);
                dmw |= (uint64_t)cb_rd16(blk + 2) << (16 * r);
            }
            prefetch_span(blk + (size_t)NR * CB_DEC_PF512 * ws, bb);
            const uint8_t *qs = blk + (q5 ? 48 : 16);
            float d = CB_F16(blk), dmin = CB_F16(blk + 2);
            const __m128i scm = k4_scale_vec(blk + 4);
            const __m512i sc16 = zext_si(_mm256_cvtepu8_epi16(scm)); /* words 0..7 scales */
            __m512i z0 = loadu512(qs), z1 = loadu512(qs + 64);
            __m512i wv[4] = {_mm512_and_si512(z0, m4), _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4),
                             _mm512_and_si512(z1, m4), _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4)};
            if (q5) {
                /* bit j of qh[l] is the fifth bit of sub-block j's value l */
                const __m512i qh = _mm512_broadcast_i64x4(loadu256(blk + 16));
                #pragma GCC unroll 4
                for (int k = 0; k < 4; k++) wv[k] = q5k_fifth_bits(wv[k], qh, k);
            }
            __m512i sv[4];
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) sv[k] = _mm512_permutexvar_epi16(q4k_sidx(k), sc16);
            const __m256i mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
                scm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(wv[0], xa[t][0]), sv[0]);
                #pragma GCC unroll 4
                for (int k = 1; k < 4; k++)
                    s = _mm512_add_epi32(s, _mm512_madd_epi16(_mm512_maddubs_epi16(wv[k], xa[t][k]),
                                                              sv[k]));
                pv[r * NT + t] = fold_epi32(s);
                mv[r * NT + t] = _mm256_madd_epi16(loadu256(a->bsums), mins);
                if (NT > 1) {
                    scd[r * NT + t] = d * dx[t];
                    smn[r * NT + t] = dmin * dx[t];
                }
            }
        }
        if (NT == 1) { /* NR <= 4: both sums of every row in one reduction, the scales as
                        * vectors; the same float operations lane by lane */
            __m256i both[8];
            #pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                both[r] = pv[r < NR ? r : 0];
                both[4 + r] = mv[r < NR ? r : 0];
            }
            const __m256 f = _mm256_cvtepi32_ps(reduce8_epi32(both, 8));
            const __m128 dx4 = _mm_set1_ps(dx[0]);
            __m128 a = _mm256_castps256_ps128(vacc);
            a = _mm_fmadd_ps(_mm256_castps256_ps128(f),
                             _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dw)), dx4), a);
            a = _mm_fnmadd_ps(_mm256_extractf128_ps(f, 1),
                              _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dmw)), dx4), a);
            vacc = _mm256_zextps128_ps256(a);
            continue;
        }
        vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_epi32(pv, NR * NT)), set8_ps(scd), vacc);
        vacc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(reduce8_epi32(mv, NR * NT)), set8_ps(smn), vacc);
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, vacc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = tmp[r * NT + t];
}

/* n lines from p into L2 (the one-token tiles: a block's lines CB_DEC_PF512 tiles ahead) */
INL void prefetch_lines(const uint8_t *p, int n) {
    for (int l = 0; l < n; l++) cb_prefetch_l2(p + 64 * l);
}

/* Lane r = the sum of the 16 int32 lanes of S[r] (unpacks, then one fold across the lanes) */
INL __m128i sum16x4(const __m512i *S) {
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(S[0], S[1]), _mm512_unpackhi_epi32(S[0], S[1]));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(S[2], S[3]), _mm512_unpackhi_epi32(S[2], S[3]));
    const __m256i u = fold_epi32(_mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23)));
    return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
}

/* four rows' sums (acc[t]: token t) into out[(r_off + r) * out_nt + t] */
INL void store_4xnt(const __m128 *acc, int NT, float *out, int out_nt, int r_off) {
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float tmp[4];
        _mm_storeu_ps(tmp, acc[t]);
        for (int r = 0; r < 4; r++) out[(r + r_off) * out_nt + t] = tmp[r];
    }
}

/* The Q4_K tile with VNNI, four rows and 1-4 tokens (the experts' gate/up in a decode step, and
 * in a prefill, where 64 prompt tokens give an expert ~4: before, 2-4 tokens ran tile_q4k in row
 * pairs; in L2 this is 1.4-1.5x faster there, the MoE bench model's 64-token prefill 1.02-1.06x,
 * 2026-12-04). The weights' bits are unpacked once per row and block for all the tokens. Per row
 * and super-block: vpdpbusd of the low and high nibbles of the two 64-byte halves of qs against
 * the activations as tile_q4k arranges them gives, per 128-bit lane, four int32 partial sums of
 * one sub-block (four products each, |sum| <= 4 * 15 * 127: an int16); vpackssdw pairs the low-
 * and high-nibble sums of a vector (exact), and one vpmaddwd / vpdpwssd against the sub-blocks'
 * scales (vpermw of the unpacked scale words) multiplies and sums them: 4 dot products, 2 packs
 * and 2 multiplies a row instead of tile_q4k's 4 maddubs, 4 madd and 4 scale permutes. The four
 * rows' 16-lane sums and the mins' 4-lane sums (against the bsums paired per sub-block) reduce
 * by unpacks to one int32 per row: the same exact integers as tile_q4k, then its float
 * operations (fma with d * dx, fnmadd with dmin * dx), so bit for bit its output (checked by
 * tests/c/test_quant_avx512.c against the AVX2 invariant tile). Q4_K 768x2048 in L2, one thread
 * (tools/bench/vs_ggml_matvec.py --in-cache): 31.7 us against tile_q4k's 37.7; from memory 1.16x
 * (the commit). Each 512-bit operation costs this core (Zen4) half a cycle of its vector unit,
 * whatever the port: the count of them is the cost. Q5_K (q5) the same, its fifth bits ORed in
 * from qh by one test-into-mask and one masked move a vector (values 0..31: a dpbusd sum of four
 * at most 4 * 31 * 128, still an int16); Q5_K 768x2048 from memory, 1 thread: 51-53 -> 42-45 us
 * against tile_q4k(q5). */
INLV void tile_q4k_1v(int q5, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                      const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    if (NR != 4) { /* pairs: tile_q4k */
        tile_q4k(q5, NR, NT, nb, w, ws, x, xs, out, out_nt, r_off);
        return;
    }
    const size_t bb = q5 ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    const __m128i z128 = _mm_setzero_si128();
    const __m512i idx0 = join_si(_mm256_setr_epi16(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1),
                                 _mm256_setr_epi16(2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 2, 2, 3, 3, 3, 3));
    const __m512i idx1 = _mm512_add_epi16(idx0, _mm512_set1_epi16(4));
    /* [d0 dm0 d1 dm1 d2 dm2 d3 dm3] -> [d0 d1 d2 d3 dm0 dm1 dm2 dm3] */
    const __m128i dsplit = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    __m128 acc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm_setzero_ps();
    const size_t PF = (size_t)4 * CB_DEC_PF512 * ws;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w0 = w + (size_t)b * bb;
        const cb_q8k_t *a[4];
        __m512i xl0[4], xh0[4], xl1[4], xh1[4];
        __m128i bsp[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
            const __m512i x0 = loadu512(a[t]->qs), x1 = loadu512(a[t]->qs + 64);
            const __m512i x2 = loadu512(a[t]->qs + 128), x3 = loadu512(a[t]->qs + 192);
            xl0[t] = _mm512_shuffle_i64x2(x0, x1, 0x44);
            xh0[t] = _mm512_shuffle_i64x2(x0, x1, 0xEE);
            xl1[t] = _mm512_shuffle_i64x2(x2, x3, 0x44);
            xh1[t] = _mm512_shuffle_i64x2(x2, x3, 0xEE);
            bsp[t] = _mm256_cvtepi32_epi16(_mm256_madd_epi16(loadu256(a[t]->bsums), _mm256_set1_epi16(1)));
        }
        __m512i S[4][4]; /* [token][row] */
        __m128i M[4][4], V[4];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *blk = w0 + (size_t)r * ws;
            /* a block's 144 bytes (the next block's prefetch has the rest); 16 rows ahead for
             * one token, 8 for more (16 made the 64-token prefill 5-10% slower) */
            prefetch_lines(blk + (NT == 1 ? PF : PF / 2), 3);
            const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk); /* dd, u0, u1, u2 */
            V[r] = v;
            const __m128i scm = k4_scale_vec_dd(v); /* sc[0..7], m[0..7] */
            const __m512i z0 = loadu512(blk + (q5 ? 48 : 16)), z1 = loadu512(blk + (q5 ? 112 : 80));
            __m512i wl0 = _mm512_and_si512(z0, m4), wh0 = _mm512_and_si512(_mm512_srli_epi16(z0, 4), m4);
            __m512i wl1 = _mm512_and_si512(z1, m4), wh1 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), m4);
            if (q5) { /* Q5_K: values 0..31 */
                const __m512i qh = _mm512_broadcast_i64x4(loadu256(blk + 16));
                wl0 = q5k_fifth_bits(wl0, qh, 0);
                wh0 = q5k_fifth_bits(wh0, qh, 1);
                wl1 = q5k_fifth_bits(wl1, qh, 2);
                wh1 = q5k_fifth_bits(wh1, qh, 3);
            }
            const __m512i sc16 = zext_si(_mm256_cvtepu8_epi16(scm));
            const __m512i p0 = _mm512_permutexvar_epi16(idx0, sc16), p1 = _mm512_permutexvar_epi16(idx1, sc16);
            const __m128i mins = _mm_unpackhi_epi8(scm, z128);
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m512i pl0 = _mm512_dpbusd_epi32(zero, wl0, xl0[t]);
                const __m512i ph0 = _mm512_dpbusd_epi32(zero, wh0, xh0[t]);
                const __m512i pl1 = _mm512_dpbusd_epi32(zero, wl1, xl1[t]);
                const __m512i ph1 = _mm512_dpbusd_epi32(zero, wh1, xh1[t]);
                S[t][r] = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_packs_epi32(pl0, ph0), p0),
                                              _mm512_packs_epi32(pl1, ph1), p1);
                M[t][r] = _mm_madd_epi16(mins, bsp[t]);
            }
        }
        const __m128i dd = _mm_unpacklo_epi64(_mm_unpacklo_epi32(V[0], V[1]), _mm_unpacklo_epi32(V[2], V[3]));
        const __m256 dmw = _mm256_cvtph_ps(_mm_shuffle_epi8(dd, dsplit));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m128i isum = sum16x4(S[t]);
            const __m128i m01 = _mm_add_epi32(_mm_unpacklo_epi32(M[t][0], M[t][1]), _mm_unpackhi_epi32(M[t][0], M[t][1]));
            const __m128i m23 = _mm_add_epi32(_mm_unpacklo_epi32(M[t][2], M[t][3]), _mm_unpackhi_epi32(M[t][2], M[t][3]));
            const __m128i msum = _mm_add_epi32(_mm_unpacklo_epi64(m01, m23), _mm_unpackhi_epi64(m01, m23));
            const __m256 dm = _mm256_mul_ps(dmw, _mm256_set1_ps(a[t]->d));
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm256_castps256_ps128(dm), acc[t]);
            acc[t] = _mm_fnmadd_ps(_mm_cvtepi32_ps(msum), _mm256_extractf128_ps(dm, 1), acc[t]);
        }
    }
    store_4xnt(acc, NT, out, out_nt, r_off);
}

CB_DEFINE_TILE4N(tile512v_q4_k, tile_q4k_1v, 0, CB_AVX512_VNNI_TARGET, 4)
CB_DEFINE_TILE4N(tile512v_q5_k, tile_q4k_1v, 1, CB_AVX512_VNNI_TARGET, 4)

/* word w of the Q6_K scale index vectors: group w/8 of the four in a vector */
static const int16_t q6_group_idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};

/* Q6_K: per half h (128 values), [ql 0..31 | ql 32..63] and the qh bytes twice give values
 * 128h+0..63 and 128h+64..127 as two vectors (4 groups of 16 each), against the activations as
 * they lie. */
INL void tile_q6k(int unused, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                  const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    (void)unused;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* per 16-bit word: high-bit shifts of values 0..31 | 32..63 (left) and 64..95 | 96..127 (right) */
    const __m512i shl = join_si(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i shr = join_si(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    const __m512i gidx = loadu512(q6_group_idx);
    __m256 vacc = _mm256_setzero_ps(); /* lanes k = r * NT + t */
    for (int64_t b = 0; b < nb; b++) {
        __m256i pv[8];
        float scd[8] = {0};
        uint64_t dw = 0; /* one token: the rows' f16 d, four words */
        #pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * 210;
            prefetch_span(blk + (size_t)NR * CB_DEC_PF512 * ws, 210);
            if (NT == 1) dw |= (uint64_t)cb_rd16(blk + 208) << (16 * r);
            float d = CB_F16(blk + 208);
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
            const __m512i sc512 = zext_si(scw);
            __m512i q[4], s[4];
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m512i ql = loadu512(blk + 64 * h);
                __m512i hv = _mm512_broadcast_i64x4(loadu256(blk + 128 + 32 * h));
                q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                           _mm512_and_si512(_mm512_sllv_epi16(hv, shl), m30));
                q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                               _mm512_and_si512(_mm512_srlv_epi16(hv, shr), m30));
                s[2 * h] = _mm512_permutexvar_epi16(
                    _mm512_add_epi16(gidx, _mm512_set1_epi16((short)(8 * h))), sc512);
                s[2 * h + 1] = _mm512_permutexvar_epi16(
                    _mm512_add_epi16(gidx, _mm512_set1_epi16((short)(8 * h + 4))), sc512);
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                __m512i acc = _mm512_madd_epi16(_mm512_maddubs_epi16(q[0], loadu512(a->qs)), s[0]);
                #pragma GCC unroll 4
                for (int k = 1; k < 4; k++)
                    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(
                        _mm512_maddubs_epi16(q[k], loadu512(a->qs + 64 * k)), s[k]));
                /* the zero point 32: 32 * sum_g sc_g * bsums_g */
                __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(loadu256(a->bsums), scw), 5);
                pv[r * NT + t] = _mm256_sub_epi32(fold_epi32(acc), corr);
                if (NT > 1) scd[r * NT + t] = d * a->d;
            }
        }
        if (NT == 1) { /* NR <= 4: d as an f16 vector, the same products lane by lane */
            const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x + b;
            const __m128 sc = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)dw)),
                                         _mm_set1_ps(a->d));
            vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_epi32(pv, NR)),
                                   _mm256_zextps128_ps256(sc), vacc);
            continue;
        }
        vacc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(reduce8_epi32(pv, NR * NT)), set8_ps(scd), vacc);
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, vacc);
    for (int r = 0; r < NR; r++)
        for (int t = 0; t < NT; t++) out[(r + r_off) * out_nt + t] = tmp[r * NT + t];
}

/* The Q6_K tile with VNNI, four rows and 1-4 tokens (the experts' down projection: a decode step,
 * a prefill's few tokens per expert), as tile_q4k_1v: the 6-bit values as unsigned bytes (one
 * vpternlogd joins the low nibble and the two high bits; once per row for all tokens), vpdpbusd against the activations as they lie (a 128-bit lane is one 16-value
 * sub-block: four sums of four products, at most 4 * 63 * 127 = 32004, an int16), vpackssdw of
 * two vectors and one multiply against the scale words; the zero point 32 as tile_q6k, against
 * the bsums (here one vpdpwssd of -bsums with 32 * sc into the same sums). The same integers and
 * float operations as tile_q6k. Q6_K 2048x768 in L2: 39.2 us against 44.1 (the commit). */
INLV void tile_q6k_1v(int unused, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws,
                      const uint8_t *x, size_t xs, float *out, int out_nt, int r_off) {
    if (NR != 4) {
        tile_q6k(unused, NR, NT, nb, w, ws, x, xs, out, out_nt, r_off);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), zero = _mm512_setzero_si512();
    const __m512i shl = join_si(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
    const __m512i shr = join_si(_mm256_setzero_si256(), _mm256_set1_epi16(2));
    /* lane l: [sc l x4, sc 4+l x4] and [sc 8+l x4, sc 12+l x4] */
    const __m512i idxa = _mm512_set_epi16(7, 7, 7, 7, 3, 3, 3, 3, 6, 6, 6, 6, 2, 2, 2, 2,
                                          5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0);
    const __m512i idxb = _mm512_add_epi16(idxa, _mm512_set1_epi16(8));
    __m128 acc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) acc[t] = _mm_setzero_ps();
    const size_t PF = (size_t)4 * CB_DEC_PF512 * ws;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *w0 = w + (size_t)b * 210;
        const cb_q8k_t *a[4];
        __m512i xv[4][4], nbs[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
            #pragma GCC unroll 4
            for (int k = 0; k < 4; k++) xv[t][k] = loadu512(a[t]->qs + 64 * k);
            nbs[t] = zext_si(_mm256_sub_epi16(_mm256_setzero_si256(), loadu256(a[t]->bsums)));
        }
        __m512i S[4][4]; /* [token][row] */
        uint64_t dw = 0;
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *blk = w0 + (size_t)r * ws;
            /* 16 rows ahead for one token, 8 for more (as tile_q4k_1v) */
            prefetch_lines(blk + (NT == 1 ? PF : PF / 2), 4);
            dw |= (uint64_t)cb_rd16(blk + 208) << (16 * r);
            __m512i q[4];
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i ql = loadu512(blk + 64 * h);
                const __m512i hv = _mm512_broadcast_i64x4(loadu256(blk + 128 + 32 * h));
                q[2 * h] = _mm512_ternarylogic_epi32(
                    ql, _mm512_and_si512(_mm512_sllv_epi16(hv, shl), m30), m4, 0xEC);
                q[2 * h + 1] = _mm512_ternarylogic_epi32(
                    _mm512_srli_epi16(ql, 4), _mm512_and_si512(_mm512_srlv_epi16(hv, shr), m30), m4, 0xEC);
            }
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(blk + 192)));
            const __m512i sc = zext_si(scw);
            const __m512i sca = _mm512_permutexvar_epi16(idxa, sc), scb = _mm512_permutexvar_epi16(idxb, sc);
            const __m512i sc32 = zext_si(_mm256_slli_epi16(scw, 5));
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const __m512i p0 = _mm512_dpbusd_epi32(zero, q[0], xv[t][0]);
                const __m512i p1 = _mm512_dpbusd_epi32(zero, q[1], xv[t][1]);
                const __m512i p2 = _mm512_dpbusd_epi32(zero, q[2], xv[t][2]);
                const __m512i p3 = _mm512_dpbusd_epi32(zero, q[3], xv[t][3]);
                __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(p0, p1), sca);
                s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(p2, p3), scb);
                S[t][r] = _mm512_dpwssd_epi32(s, nbs[t], sc32);
            }
        }
        const __m128 scw4 = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)dw));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m128i isum = sum16x4(S[t]);
            acc[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(scw4, _mm_set1_ps(a[t]->d)), acc[t]);
        }
    }
    store_4xnt(acc, NT, out, out_nt, r_off);
}

CB_DEFINE_TILE4N(tile512v_q6_k, tile_q6k_1v, 0, CB_AVX512_VNNI_TARGET, 4)
CB_DEFINE_TILE4(tile512_q4_k, tile_q4k, 0, CB_AVX512_TARGET, 4)
CB_DEFINE_TILE4(tile512_q5_k, tile_q4k, 1, CB_AVX512_TARGET, 4)
CB_DEFINE_TILE4(tile512_q6_k, tile_q6k, 0, CB_AVX512_TARGET, 4)

/* K-quants (cb_avx2_rp_pack's layout for Q4_K/Q5_K/Q6_K, see quant_avx2.c): 64 steps of 32
 * bytes, then ns scale vectors, 8 min vectors, d[8], dmin[8]. Pairs of steps as above; one
 * sub-block (Q4_K/Q5_K: 8 steps, Q6_K: 4) is at most rpk_g steps per int16 lane, so each
 * sub-block widens once with its scales. */
INL int rpk_ns(int type) { return type == CB_TYPE_Q6_K ? 16 : 8; }
INL size_t rpk_bstride(int type) {
    return 2048 + (size_t)(type == CB_TYPE_Q6_K ? 16 : 8) * 32 + 256 + 64;
}

INL void rpk_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                  float *out) {
    const int ns = rpk_ns(type), SB = 64 / ns; /* steps per sub-block */
    const size_t bst = rpk_bstride(type);
    __m256 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst, *scv = q + 2048, *mnv = scv + 32 * ns;
        const cb_q8k_t *a[4];
        __m512i isum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            isum[t] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 1
        for (int j = 0; j < ns; j++) {
            const __m512i sc = _mm512_broadcast_i64x4(loadu256(scv + 32 * j));
            __m512i xj[4], a16[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const uint8_t *xp = (const uint8_t *)a[t]->qs + 4 * SB * j;
                /* the sub-block's 4*SB activation bytes (32 or 16) */
                xj[t] = SB == 8 ? zext_si(loadu256(xp))
                                : _mm512_inserti32x4(_mm512_setzero_si512(),
                                                     _mm_loadu_si128((const __m128i *)(const void *)xp), 0);
                a16[t] = _mm512_setzero_si512();
            }
            #pragma GCC unroll 4
            for (int p = 0; p < SB / 2; p++) {
                __m512i wv = loadu512(q + 32 * (j * SB + 2 * p));
                __m512i idx = pair_idx(p);
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    a16[t] = _mm512_add_epi16(
                        a16[t], _mm512_maddubs_epi16(wv, _mm512_permutexvar_epi32(idx, xj[t])));
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_madd_epi16(a16[t], sc));
        }
        const __m256 dv = _mm256_loadu_ps((const float *)(const void *)(mnv + 256));
        const __m256 dmv = _mm256_loadu_ps((const float *)(const void *)(mnv + 288));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            /* min vectors k, k+1 against bsums pairs k, k+1 */
            const __m512i bs = zext_si(loadu256(a[t]->bsums));
            __m512i ms = _mm512_setzero_si512();
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                ms = _mm512_add_epi32(ms, _mm512_madd_epi16(loadu512(mnv + 64 * p),
                                                            _mm512_permutexvar_epi32(pair_idx(p), bs)));
            const __m256 dxv = _mm256_set1_ps(a[t]->d);
            if (type == CB_TYPE_Q6_K) { /* zero point in the integers: the AVX2 tiles' rule */
                facc[t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(fold_epi32(isum[t]), fold_epi32(ms))),
                    _mm256_mul_ps(dv, dxv), facc[t]);
                continue;
            }
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_epi32(isum[t])), _mm256_mul_ps(dv, dxv),
                                      facc[t]);
            facc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(fold_epi32(ms)), _mm256_mul_ps(dmv, dxv),
                                       facc[t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float tmp[8];
        _mm256_storeu_ps(tmp, facc[t]);
        for (int r = 0; r < 8; r++) out[r * NT + t] = tmp[r];
    }
}

/* The K-quant tile with AVX512-VNNI: a sub-block's products accumulate in int32 with one
 * vpdpbusd per token and pair of steps (instead of maddubs + add into int16), then one int32
 * multiply by the sub-block's scale (instead of madd with the (sc, sc) int16 pairs, read here as
 * int32 >> 16). The same exact integers, so the same floats as rpk_tile. */
INLV void rpkv_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                   float *out) {
    const int ns = rpk_ns(type), SB = 64 / ns; /* steps per sub-block */
    const size_t bst = rpk_bstride(type);
    __m256 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst, *scv = q + 2048, *mnv = scv + 32 * ns;
        const cb_q8k_t *a[4];
        __m512i isum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            isum[t] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 1
        for (int j = 0; j < ns; j++) {
            /* the (sc, sc) int16 pairs as one int32 sc per row lane (sign kept: Q6_K) */
            const __m512i sc = _mm512_srai_epi32(_mm512_broadcast_i64x4(loadu256(scv + 32 * j)), 16);
            __m512i xj[4], a16[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                const uint8_t *xp = (const uint8_t *)a[t]->qs + 4 * SB * j;
                /* the sub-block's 4*SB activation bytes (32 or 16) */
                xj[t] = SB == 8 ? zext_si(loadu256(xp))
                                : _mm512_inserti32x4(_mm512_setzero_si512(),
                                                     _mm_loadu_si128((const __m128i *)(const void *)xp), 0);
                a16[t] = _mm512_setzero_si512();
            }
            #pragma GCC unroll 4
            for (int p = 0; p < SB / 2; p++) {
                __m512i wv = loadu512(q + 32 * (j * SB + 2 * p));
                __m512i idx = pair_idx(p);
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    a16[t] = _mm512_dpbusd_epi32(a16[t], wv,
                                                 _mm512_permutexvar_epi32(idx, xj[t]));
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(a16[t], sc));
        }
        const __m256 dv = _mm256_loadu_ps((const float *)(const void *)(mnv + 256));
        const __m256 dmv = _mm256_loadu_ps((const float *)(const void *)(mnv + 288));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            /* min vectors k, k+1 against bsums pairs k, k+1 */
            const __m512i bs = zext_si(loadu256(a[t]->bsums));
            __m512i ms = _mm512_setzero_si512();
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
                ms = _mm512_add_epi32(ms, _mm512_madd_epi16(loadu512(mnv + 64 * p),
                                                            _mm512_permutexvar_epi32(pair_idx(p), bs)));
            const __m256 dxv = _mm256_set1_ps(a[t]->d);
            if (type == CB_TYPE_Q6_K) { /* zero point in the integers: the AVX2 tiles' rule */
                facc[t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(fold_epi32(isum[t]), fold_epi32(ms))),
                    _mm256_mul_ps(dv, dxv), facc[t]);
                continue;
            }
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_epi32(isum[t])), _mm256_mul_ps(dv, dxv),
                                      facc[t]);
            facc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(fold_epi32(ms)), _mm256_mul_ps(dmv, dxv),
                                       facc[t]);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        float tmp[8];
        _mm256_storeu_ps(tmp, facc[t]);
        for (int r = 0; r < 8; r++) out[r * NT + t] = tmp[r];
    }
}

/* The VNNI K-quant tile on 16-row groups (cb_avx2_rp16_pack, quant_avx2_k.c): one vpdpbusd per
 * token and step serves 16 rows x 4 values against a broadcast activation word (no permutes),
 * the sub-block's int32 sums are multiplied by the rows' int32 scales, the mins are 8 madds
 * against broadcast bsums pairs. The same exact integers per row, then the same float
 * operations as rpk_tile / rpkv_tile: bit-identical. out[r * NT + t], r < 16. */
INLV void rpkv16_tile(int type, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                      size_t xs, float *out) {
    const int ns = rpk_ns(type), SB = 64 / ns; /* steps per sub-block */
    const size_t bst = cb_rp16_bstride(type);
    __m512 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * bst, *scv = q + 4096, *mnv = scv + 64 * ns;
        const uint8_t *xq[4];
        __m512i isum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            xq[t] = (const uint8_t *)a->qs;
            isum[t] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 1
        for (int j = 0; j < ns; j++) {
            const __m512i sc = loadu512(scv + 64 * j);
            __m512i a32[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) a32[t] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int i = 0; i < SB; i++) {
                const int s = j * SB + i;
                __m512i wv = loadu512(q + 64 * s);
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++)
                    a32[t] = _mm512_dpbusd_epi32(a32[t], wv, _mm512_set1_epi32(rd_i32(xq[t] + 4 * s)));
            }
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(a32[t], sc));
        }
        const __m512 dv = _mm512_loadu_ps((const float *)(const void *)(mnv + 512));
        const __m512 dmv = _mm512_loadu_ps((const float *)(const void *)(mnv + 576));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            __m512i ms = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                ms = _mm512_add_epi32(ms, _mm512_madd_epi16(loadu512(mnv + 64 * k),
                                                            _mm512_set1_epi32(rd_i32((const uint8_t *)a->bsums + 4 * k))));
            const __m512 dxv = _mm512_set1_ps(a->d);
            if (type == CB_TYPE_Q6_K) { /* zero point in the integers: the AVX2 tiles' rule */
                facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(isum[t], ms)),
                                          _mm512_mul_ps(dv, dxv), facc[t]);
                continue;
            }
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, dxv), facc[t]);
            facc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms), _mm512_mul_ps(dmv, dxv), facc[t]);
        }
    }
    store16(facc, NT, out);
}

CB_DEFINE_RPV(rpv16_q4_k, rpkv16_tile, CB_TYPE_Q4_K)
CB_DEFINE_RPV(rpv16_q5_k, rpkv16_tile, CB_TYPE_Q5_K)
CB_DEFINE_RPV(rpv16_q6_k, rpkv16_tile, CB_TYPE_Q6_K)

CB_DEFINE_RPV(rpv512_q4_k, rpkv_tile, CB_TYPE_Q4_K)
CB_DEFINE_RPV(rpv512_q5_k, rpkv_tile, CB_TYPE_Q5_K)
CB_DEFINE_RPV(rpv512_q6_k, rpkv_tile, CB_TYPE_Q6_K)

CB_DEFINE_RP(rp512_q4_k, rpk_tile, CB_TYPE_Q4_K)
CB_DEFINE_RP(rp512_q5_k, rpk_tile, CB_TYPE_Q5_K)
CB_DEFINE_RP(rp512_q6_k, rpk_tile, CB_TYPE_Q6_K)

/* The Q6_K_R16 layout (include/colibri/quant.h, quant_r16.c packs it): 16 rows of a super-block
 * read in place and in order, one vpdpbusd per token and step (16 rows x 4 values) against the
 * broadcast activation word. Chunk k (k < 16) holds steps k, k + 16, k + 32, k + 48: the values
 * of sub-blocks G, G + 4, G + 8, G + 12 (G = k / 4), so four chunks complete four sub-blocks,
 * whose int32 sums start at -32 * bsum (the zero point) and are then multiplied by the rows' int8
 * scales. The integers per row are the Q6_K tiles' (exact), then fma(isum, d * d_x, acc) per
 * super-block as they do: bit-identical. out[r * NT + t], NT <= 4 (cb_q8k_t rows).
 * Software prefetch (the super-block CB_R16K_PF ahead) only in token tiles (NT > 1): one token's
 * tile reads a group as one sequential stream, which the hardware prefetchers follow, and there
 * the prefetch cost the 255 MB Q6_K_R16 head of the MoE bench model 12-15% from memory at 1 thread
 * (25 -> 29 GB/s, vs_ggml_matvec) and its decode 4-5%; with 16 prompt tokens (more arithmetic a
 * byte) it gains a few % (2026-12-04, docs/benchmarks.md). The same rule in r16k4_tile and
 * quant_avx512.c's r16_tile. */
#ifndef CB_R16K_PF
#define CB_R16K_PF 2 /* super-blocks ahead (from memory, 1 thread: 1 and 3-8 were slower) */
#endif
INLV void r16k_tile(int unused, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                    size_t xs, float *out) {
    (void)unused;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * 3360, *scv = q + 3072;
        const cb_q8k_t *a[4];
        __m512i isum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            isum[t] = _mm512_setzero_si512();
        }
        #pragma GCC unroll 1
        for (int G = 0; G < 4; G++) {
            __m512i acc[4][4]; /* [f][t]: sub-block G + 4f */
            #pragma GCC unroll 4
            for (int f = 0; f < 4; f++)
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) acc[f][t] = _mm512_set1_epi32(-32 * a[t]->bsums[G + 4 * f]);
            #pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const int k = 4 * G + i;
                const uint8_t *c = q + 192 * k;
                if (NT > 1) { /* 4 lines a chunk (the next groups are contiguous: prefetching
                               * past this group's end is reading ahead) */
                    #pragma GCC unroll 4
                    for (int l = 0; l < 4; l++) cb_prefetch_l2(q + CB_R16K_PF * 3360 + 256 * k + 64 * l);
                }
                const __m512i l0 = loadu512(c), l1 = loadu512(c + 64), h = loadu512(c + 128);
                /* (low or high nibbles) | (the high-bit field at bits 4, 5) */
                __m512i w[4];
                w[0] = _mm512_ternarylogic_epi32(l0, _mm512_and_si512(_mm512_slli_epi16(h, 4), m30), m4, 0xEC);
                w[1] = _mm512_ternarylogic_epi32(l1, _mm512_and_si512(_mm512_slli_epi16(h, 2), m30), m4, 0xEC);
                w[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l0, 4), _mm512_and_si512(h, m30), m4, 0xEC);
                w[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(l1, 4),
                                                 _mm512_and_si512(_mm512_srli_epi16(h, 2), m30), m4, 0xEC);
                #pragma GCC unroll 4
                for (int f = 0; f < 4; f++)
                    #pragma GCC unroll 4
                    for (int t = 0; t < NT; t++)
                        acc[f][t] = _mm512_dpbusd_epi32(acc[f][t], w[f], _mm512_set1_epi32(
                            rd_i32((const uint8_t *)a[t]->qs + 4 * (k + 16 * f))));
            }
            #pragma GCC unroll 4
            for (int f = 0; f < 4; f++) {
                const __m512i sc = _mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(const void *)(scv + 16 * (G + 4 * f))));
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(acc[f][t], sc));
            }
        }
        const __m512 dv = _mm512_cvtph_ps(loadu256(q + 3328));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, _mm512_set1_ps(a[t]->d)),
                                      facc[t]);
    }
    store16(facc, NT, out);
}

/* The Q4_K_R16 layout (include/colibri/quant.h): vector 8j + i holds step 8j + i of sub-block
 * j in its low nibbles and step 8j + i + 32 of sub-block j + 4 in its high ones, so eight vectors
 * complete two sub-blocks, each an int32 sum per row then multiplied by the rows' 6-bit scale.
 * The mins: per row sum_j m_j * (bsums 2j + 2j+1), one int32 multiply per sub-block against
 * the broadcast pair sum. Scales and mins (6 bits: the scale byte's low 6 bits, its top 2 the
 * min's low bits, a nibble plane the min's high 4) are decoded once per super-block. The exact
 * integers of the Q4_K tiles, then fma(isum, d * d_x) and fnmadd(mins, dmin * d_x) as they do:
 * bit-identical. out[r * NT + t], NT <= 4. */
#ifndef CB_R16K4_PF
#define CB_R16K4_PF 3
#endif
INLV void r16k4_tile(int unused, int NT, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                     size_t xs, float *out) {
    (void)unused;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    const __m512i m6 = _mm512_set1_epi8(0x3F), m3c = _mm512_set1_epi8(0x3C);
    __m512 facc[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) facc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = pk + (size_t)b * 2304;
        const cb_q8k_t *a[4];
        __m512i isum[4], msum[4];
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            a[t] = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
            isum[t] = msum[t] = _mm512_setzero_si512();
        }
        /* [sub-block j][row] scales (bytes 0..127) and mins (128..255) */
        uint8_t sm[256];
        {
            const __m512i s0 = loadu512(q + 2048), s1 = loadu512(q + 2112), nv = loadu512(q + 2176);
            _mm512_storeu_si512((void *)sm, _mm512_and_si512(s0, m6));
            _mm512_storeu_si512((void *)(sm + 64), _mm512_and_si512(s1, m6));
            _mm512_storeu_si512((void *)(sm + 128),
                                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(s0, 6), m3),
                                                _mm512_and_si512(_mm512_slli_epi16(nv, 2), m3c)));
            _mm512_storeu_si512((void *)(sm + 192),
                                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(s1, 6), m3),
                                                _mm512_and_si512(_mm512_srli_epi16(nv, 2), m3c)));
        }
        #pragma GCC unroll 1
        for (int j = 0; j < 4; j++) {
            __m512i lo[4], hi[4];
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_si512();
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const int s = 8 * j + i;
                if (NT > 1 && i % 2 == 0) { /* token tiles: the super-block CB_R16K4_PF ahead, 9 lines a pair */
                    const uint8_t *pf = q + CB_R16K4_PF * 2304 + 576 * j + 64 * (i / 2);
                    cb_prefetch_l2(pf);
                    cb_prefetch_l2(pf + 256);
                    if (i == 0) cb_prefetch_l2(pf + 512);
                }
                const __m512i v = loadu512(q + 64 * s);
                const __m512i wl = _mm512_and_si512(v, m4), wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                #pragma GCC unroll 4
                for (int t = 0; t < NT; t++) {
                    const uint8_t *xq = (const uint8_t *)a[t]->qs;
                    lo[t] = _mm512_dpbusd_epi32(lo[t], wl, _mm512_set1_epi32(rd_i32(xq + 4 * s)));
                    hi[t] = _mm512_dpbusd_epi32(hi[t], wh, _mm512_set1_epi32(rd_i32(xq + 4 * (s + 32))));
                }
            }
            const __m512i scl = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sm + 16 * j)));
            const __m512i sch = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sm + 16 * (j + 4))));
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], scl),
                                                                     _mm512_mullo_epi32(hi[t], sch)));
        }
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i mj = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(sm + 128 + 16 * j)));
            #pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                msum[t] = _mm512_add_epi32(msum[t], _mm512_mullo_epi32(
                    mj, _mm512_set1_epi32(a[t]->bsums[2 * j] + a[t]->bsums[2 * j + 1])));
        }
        const __m512 dv = _mm512_cvtph_ps(loadu256(q + 2240)), dmv = _mm512_cvtph_ps(loadu256(q + 2272));
        #pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const __m512 dx = _mm512_set1_ps(a[t]->d);
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dv, dx), facc[t]);
            facc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(dmv, dx), facc[t]);
        }
    }
    store16(facc, NT, out);
}

CB_DEFINE_RPV(r16_q6_k, r16k_tile, CB_TYPE_Q6_K_R16)
CB_DEFINE_RPV(r16_q4_k, r16k4_tile, CB_TYPE_Q4_K_R16)

void CB_AVX512_FN(r16k_tile_vnni)(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out) {
    if (layout == CB_TYPE_Q4_K_R16)
        r16_q4_k(pk, nb, xa, xs, nt, out);
    else
        r16_q6_k(pk, nb, xa, xs, nt, out);
}

/* the invariant direct tiles with VNNI: Q4_K's and Q6_K's one-token tiles above (other shapes
 * fall back to k_tile's inside them), k_tile for Q5_K */
cb_tile_fn CB_AVX512_FN(k_tile_vnni)(int type) {
    switch (type) {
    case CB_TYPE_Q4_K: return tile512v_q4_k;
    case CB_TYPE_Q5_K: return tile512v_q5_k;
    case CB_TYPE_Q6_K: return tile512v_q6_k;
    default: return CB_AVX512_FN(k_tile)(type);
    }
}

cb_tile_fn CB_AVX512_FN(k_tile)(int type) {
    switch (type) {
    case CB_TYPE_Q4_K: return tile512_q4_k;
    case CB_TYPE_Q5_K: return tile512_q5_k;
    case CB_TYPE_Q6_K: return tile512_q6_k;
    default: return NULL;
    }
}

void CB_AVX512_FN(k_rp_tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs,
                             int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_K: rp512_q4_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_K: rp512_q5_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q6_K: rp512_q6_k(pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

void CB_AVX512_FN(k_rp16_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                    size_t xs, int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_K: rpv16_q4_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_K: rpv16_q5_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q6_K: rpv16_q6_k(pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

void CB_AVX512_FN(k_rp_tile_vnni)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                                  size_t xs, int nt, float *out) {
    switch (type) {
    case CB_TYPE_Q4_K: rpv512_q4_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q5_K: rpv512_q5_k(pk, nb, xa, xs, nt, out); break;
    case CB_TYPE_Q6_K: rpv512_q6_k(pk, nb, xa, xs, nt, out); break;
    default: break;
    }
}

#else
/* Not x86-64 GCC/Clang: no AVX-512 kernels; quant_avx512.c's stubs never call here. */
typedef int cb_quant_avx512_k_unused;
#endif
