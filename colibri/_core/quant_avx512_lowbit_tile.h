/* The tiles of quant_avx512_lowbit.c as a template, included there twice: L5_VNNI 0 (AVX-512
 * BW: vpmaddwd + vpaddd) and 1 (AVX512-VNNI: vpdpwssd, TQ2_0 vpdpbusd), names through L5_FN,
 * helpers L5_ATTR, entry points L5_TARGET. The integer sums are the same either way (no
 * saturating form is used), so both give the scalar kernels' bits. Not a header of its own. */
/* the 16 int32 lanes of scale * |w| * (x negated under the mask), summing to the block's isum
 * (TQ2_0: the digits q + 1 against x, the caller takes the sum of x back out) */
L5_ATTR __m512i L5_FN(l5_dot)(int kind, const l5_block *k, const int8_t *qs) {
    __m512i acc = _mm512_setzero_si512();
    for (int v = 0; v < 4; v++) {
        __m512i x = loadu512(qs + 64 * v);
        if (kind != L5_Q2_K && kind != L5_TQ2_0)
            x = _mm512_mask_sub_epi8(x, (__mmask64)k->neg[v], _mm512_setzero_si512(), x);
#if L5_VNNI
        if (kind == L5_TQ2_0)
            acc = _mm512_dpbusd_epi32(acc, k->w[v], x);
        else
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(k->w[v], x), k->sc[v]);
#else
        if (kind == L5_TQ2_0)
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(k->w[v], x), _mm512_set1_epi16(1)));
        else
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(k->w[v], x), k->sc[v]));
#endif
    }
    return acc;
}

/* NR rows x NT tokens (NR * NT <= 16, NR <= 8), out[r*NT + t] */
L5_ATTR void L5_FN(tile5)(int kind, int NR, int NT, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x,
               size_t xs, float *out) {
    const size_t bb = l5_bytes(kind), doff = l5_doff(kind);
    const int N = NR * NT <= 8 ? 8 : 16;
    int ri[16], ti[16];
    for (int p = 0; p < 16; p++) {
        ri[p] = p / NT < NR ? p / NT : 0;
        ti[p] = p % NT;
    }
    const __m512i row_idx = loadu512(ri), tok_idx = loadu512(ti);
    __m512 facc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i v[16];
        uint16_t dh[8] = {0}, mh[8] = {0};
        float xd[4] = {0};
        int xsum[16] = {0}; /* TQ2_0: the token's sum of x, at its lanes */
        for (int p = NR * NT; p < N; p++) v[p] = _mm512_setzero_si512();
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * ws + (size_t)b * bb;
            prefetch_span(blk + (size_t)NR * CB_DEC_PF512 * ws, bb); /* the tiles ahead, into L2 */
            l5_block k;
            k.mins = _mm256_setzero_si256(); /* read for Q2_K only */
            l5_decode(kind, blk, &k);
            dh[r] = cb_rd16(blk + doff);
            if (kind == L5_Q2_K) mh[r] = cb_rd16(blk + 82);
            for (int t = 0; t < NT; t++) {
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(x + (size_t)t * xs) + b;
                if (r == 0) {
                    xd[t] = a->d;
                    if (kind == L5_TQ2_0) {
                        const __m256i bs = _mm256_madd_epi16(loadu256(a->bsums), _mm256_set1_epi16(1));
                        __m128i q = _mm_add_epi32(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                        q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
                        q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
                        const int sx = _mm_cvtsi128_si32(q);
                        for (int rr = 0; rr < NR; rr++) xsum[rr * NT + t] = sx;
                    }
                }
                const __m512i s = L5_FN(l5_dot)(kind, &k, a->qs);
                if (kind == L5_Q2_K) {
                    const __m256i m = _mm256_madd_epi16(k.mins, loadu256(a->bsums));
                    v[r * NT + t] = join_si(fold_epi32(s), m);
                } else {
                    v[r * NT + t] = s;
                }
            }
        }
        /* the scales as the scalar kernel converts them (f16 -> f32 is exact), spread to lanes */
        const __m512 dr = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)dh)));
        const __m512 dw = NT == 1 ? dr : _mm512_permutexvar_ps(row_idx, dr);
        const __m512 dx = NT == 1 ? _mm512_set1_ps(xd[0])
                                  : _mm512_permutexvar_ps(tok_idx, _mm512_castps128_ps512(_mm_loadu_ps(xd)));
        __m512 dd = _mm512_mul_ps(dw, dx);
        if (l5_dscale(kind) != 1.0f) dd = _mm512_mul_ps(dd, _mm512_set1_ps(l5_dscale(kind)));
        if (kind == L5_Q2_K) {
            const __m512 mr = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)mh)));
            const __m512 dm = NT == 1 ? mr : _mm512_permutexvar_ps(row_idx, mr);
            __m512i is, ms;
            reduce_split(v, N, &is, &ms);
            facc = _mm512_add_ps(facc, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(is)));
            facc = _mm512_sub_ps(facc, _mm512_mul_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(ms)));
        } else {
            __m512i is = reduce_full(v, N);
            if (kind == L5_TQ2_0) is = _mm512_sub_epi32(is, loadu512(xsum));
            facc = _mm512_add_ps(facc, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(is)));
        }
    }
    float tmp[16];
    _mm512_storeu_ps(tmp, facc);
    memcpy(out, tmp, sizeof(float) * (size_t)(NR * NT));
}

/* the driver's shapes: one token up to 8 rows, else up to 4 rows x 4 tokens */
#define L5_TILE(name, kind)                                                                     \
    L5_TARGET static void name(int64_t nb, const uint8_t *w, size_t ws, int nr,          \
                                      const uint8_t *x, size_t xs, int nt, float *out) {       \
        if (nt == 1) {                                                                         \
            switch (nr) {                                                                      \
            case 8: L5_FN(tile5)(kind, 8, 1, nb, w, ws, x, xs, out); return;                          \
            case 4: L5_FN(tile5)(kind, 4, 1, nb, w, ws, x, xs, out); return;                          \
            default: break;                                                                    \
            }                                                                                  \
        }                                                                                      \
        if (nr == 4 && nt == 4) {                                                              \
            L5_FN(tile5)(kind, 4, 4, nb, w, ws, x, xs, out);                                          \
            return;                                                                            \
        }                                                                                      \
        for (int r = 0; r < nr; r++)                                                           \
            switch (nt) {                                                                      \
            case 1: L5_FN(tile5)(kind, 1, 1, nb, w + (size_t)r * ws, ws, x, xs, out + r); break;      \
            case 2: L5_FN(tile5)(kind, 1, 2, nb, w + (size_t)r * ws, ws, x, xs, out + 2 * r); break;  \
            case 3: L5_FN(tile5)(kind, 1, 3, nb, w + (size_t)r * ws, ws, x, xs, out + 3 * r); break;  \
            default: L5_FN(tile5)(kind, 1, 4, nb, w + (size_t)r * ws, ws, x, xs, out + 4 * r); break; \
            }                                                                                  \
    }
L5_TILE(L5_FN(tile5_q2_k), L5_Q2_K)
L5_TILE(L5_FN(tile5_q3_k), L5_Q3_K)
L5_TILE(L5_FN(tile5_tq2_0), L5_TQ2_0)
L5_TILE(L5_FN(tile5_iq4_xs), L5_IQ4_XS)
L5_TILE(L5_FN(tile5_iq2_xxs), L5_IQ2_XXS)
L5_TILE(L5_FN(tile5_iq3_xxs), L5_IQ3_XXS)
L5_TILE(L5_FN(tile5_iq1_s), L5_IQ1_S)
#undef L5_TILE

static cb_tile_fn L5_FN(l5_tile)(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return L5_FN(tile5_q2_k);
    case CB_TYPE_Q3_K: return L5_FN(tile5_q3_k);
    case CB_TYPE_TQ2_0: return L5_FN(tile5_tq2_0);
    case CB_TYPE_IQ4_XS: return L5_FN(tile5_iq4_xs);
    case CB_TYPE_IQ2_XXS: return L5_FN(tile5_iq2_xxs);
    case CB_TYPE_IQ3_XXS: return L5_FN(tile5_iq3_xxs);
    case CB_TYPE_IQ1_S: return L5_FN(tile5_iq1_s);
    default: return NULL;
    }
}
