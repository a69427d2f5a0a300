/* The low-bit GGML types outside the i-quant family: Q2_K, Q3_K, Q8_K, TQ1_0, TQ2_0 (layouts in
 * include/colibri/quant.h): their scalar dequantizers and dot products, and the dispatch that
 * quant.c asks for every type it does not hold itself (this file's, then quant_iq.c's).
 *
 * Dequantizers follow gguf-py's float32 operation order exactly (gguf.quants, no FMA
 * contraction under -std=c11), so they match its reference bit for bit, NaN and Inf scales
 * included. Dot products take activations quantized to cb_q8k_t (256-blocks, like llama.cpp's
 * Q8_K): per super-block an exact int32 sum of weight integers times activation integers (the
 * sub-block scales are integers too), then one float scale per super-block, as the K-quants'
 * kernels in quant.c do; the error is the activation rounding bound of quant.h.
 * Ownership: pointers are borrowed for one call.
 */
#include "quant_impl.h"

/* ---------------------------------------------------------------- Q2_K */

/* {u8 scales[16]; u8 qs[64]; f16 d, dmin}: value i = 128h + 32s + l (h < 2, s < 4, l < 32) is
 * q = (qs[32h + l] >> 2s) & 3 of sub-block j = i/16: v = (d*(sc_j & 15))*q - dmin*(sc_j >> 4). */
static inline int q2k_q(const uint8_t *qs, int i) {
    return (qs[32 * (i >> 7) + (i & 31)] >> (2 * ((i >> 5) & 3))) & 3;
}

static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    float d = cb_f16_to_f32(cb_rd16(b + 80)), dmin = cb_f16_to_f32(cb_rd16(b + 82));
    for (int i = 0; i < 256; i++) {
        float dl = d * (float)(sc[i / 16] & 0x0F), ml = dmin * (float)(sc[i / 16] >> 4);
        y[i] = dl * (float)q2k_q(qs, i) - ml;
    }
}

static float dot_q2_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 84) {
        const uint8_t *sc = w, *qs = w + 16;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 16; j++) {
            int p = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) p += q2k_q(qs, i) * a[b].qs[i];
            sumi += (sc[j] & 0x0F) * p;
            summ += (sc[j] >> 4) * a[b].bsums[j];
        }
        acc += (cb_f16_to_f32(cb_rd16(w + 80)) * a[b].d) * (float)sumi;
        acc -= (cb_f16_to_f32(cb_rd16(w + 82)) * a[b].d) * (float)summ;
    }
    return acc;
}

/* ---------------------------------------------------------------- Q3_K */

/* {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: value i = 128h + 32s + l has the low bits
 * (qs[32h + l] >> 2s) & 3 and the high bit m = (hmask[l] >> (i/32)) & 1: q = low - 4*(1 - m)
 * (-4..3). The 6-bit scale of sub-block j = i/16: low 4 bits from scales[j % 8] (nibble j/8),
 * high 2 from scales[8 + j % 4] >> 2*(j/4); v = (d*(scale - 32))*q. */
static inline int q3k_q(const uint8_t *hm, const uint8_t *qs, int i) {
    int lo = (qs[32 * (i >> 7) + (i & 31)] >> (2 * ((i >> 5) & 3))) & 3;
    return lo - (((hm[i & 31] >> (i >> 5)) & 1) ? 0 : 4);
}

static inline int q3k_scale(const uint8_t *s, int j) {
    int lo = (s[j & 7] >> (4 * (j >> 3))) & 0x0F, hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    float d = cb_f16_to_f32(cb_rd16(b + 108));
    for (int i = 0; i < 256; i++) y[i] = (d * (float)q3k_scale(sc, i / 16)) * (float)q3k_q(hm, qs, i);
}

static float dot_q3_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 110) {
        const uint8_t *hm = w, *qs = w + 32, *sc = w + 96;
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int p = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) p += q3k_q(hm, qs, i) * a[b].qs[i];
            sumi += q3k_scale(sc, j) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w + 108)) * a[b].d) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- Q8_K */

/* {f32 d; i8 qs[256]; i16 bsums[16]}: v = d*q (llama.cpp's activation type; a weight if a file
 * holds it). gguf has no dequantizer for it: the tests check this definition. */
static void deq_q8_k(const uint8_t *b, float *y) {
    float d;
    memcpy(&d, b, 4);
    for (int i = 0; i < 256; i++) y[i] = d * (float)(int8_t)b[4 + i];
}

static float dot_q8_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 292) {
        int sumi = 0;
        for (int i = 0; i < 256; i++) sumi += (int8_t)w[4 + i] * a[b].qs[i];
        float d;
        memcpy(&d, w, 4);
        acc += (d * a[b].d) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- TQ1_0, TQ2_0 */

/* TQ1_0 {u8 qs[48]; u8 qh[4]; f16 d}: base-3 digits, 5 a byte (4 in qh): the digit of power
 * 3^p of byte c is ((u8)(c * 3^p) * 3) >> 8 (0..2), q = digit - 1, v = d*q. Values 0..159: byte
 * qs[i%32], p = i/32; 160..239: qs[32 + (i-160)%16], p = (i-160)/16; 240..255: qh[(i-240)%4],
 * p = (i-240)/4. */
static void tq1_values(const uint8_t *b, int8_t *q) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int i = 0; i < 256; i++) {
        uint8_t c, p;
        if (i < 160) {
            c = b[i & 31];
            p = pow3[i >> 5];
        } else if (i < 240) {
            c = b[32 + ((i - 160) & 15)];
            p = pow3[(i - 160) >> 4];
        } else {
            c = b[48 + ((i - 240) & 3)];
            p = pow3[(i - 240) >> 2];
        }
        uint8_t m = (uint8_t)(c * p);
        q[i] = (int8_t)(((unsigned)m * 3u >> 8) - 1);
    }
}

static void deq_tq1_0(const uint8_t *b, float *y) {
    int8_t q[256];
    tq1_values(b, q);
    float d = cb_f16_to_f32(cb_rd16(b + 52));
    for (int i = 0; i < 256; i++) y[i] = d * (float)q[i];
}

static float dot_tq1_0(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    int8_t q[256];
    for (int64_t b = 0; b < nb; b++, w += 54) {
        tq1_values(w, q);
        int sumi = 0;
        for (int i = 0; i < 256; i++) sumi += q[i] * a[b].qs[i];
        acc += (cb_f16_to_f32(cb_rd16(w + 52)) * a[b].d) * (float)sumi;
    }
    return acc;
}

/* TQ2_0 {u8 qs[64]; f16 d}: value i = 128h + 32s + l is q = ((qs[32h + l] >> 2s) & 3) - 1. */
static void deq_tq2_0(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b + 64));
    for (int i = 0; i < 256; i++) y[i] = d * (float)(q2k_q(b, i) - 1);
}

static float dot_tq2_0(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 66) {
        int sumi = 0;
        for (int i = 0; i < 256; i++) sumi += (q2k_q(w, i) - 1) * a[b].qs[i];
        acc += (cb_f16_to_f32(cb_rd16(w + 64)) * a[b].d) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- dispatch */

cb_deq_fn cb_lowbit_deq(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return deq_q2_k;
    case CB_TYPE_Q3_K: return deq_q3_k;
    case CB_TYPE_Q8_K: return deq_q8_k;
    case CB_TYPE_TQ1_0: return deq_tq1_0;
    case CB_TYPE_TQ2_0: return deq_tq2_0;
    default: return cb_iq_deq(type);
    }
}

cb_dot_fn cb_lowbit_dot(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return dot_q2_k;
    case CB_TYPE_Q3_K: return dot_q3_k;
    case CB_TYPE_Q8_K: return dot_q8_k;
    case CB_TYPE_TQ1_0: return dot_tq1_0;
    case CB_TYPE_TQ2_0: return dot_tq2_0;
    default: return cb_iq_dot(type);
    }
}
