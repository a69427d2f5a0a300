/* The i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS; layouts in
 * include/colibri/quant.h): scalar dequantizers and dot products. The lattice grids, the sign
 * table and IQ4_NL's 16 values are data generated from the gguf package (quant_iq_tables.h,
 * tools/gen_iq_tables.py).
 *
 * Dequantizers follow gguf-py's float32 operation order exactly (no FMA contraction under
 * -std=c11), so they match its reference bit for bit, NaN and Inf scales included.
 *
 * Dot products: IQ4_NL against cb_q8a_t (32-blocks), the others against cb_q8k_t (256-blocks).
 * Every weight is an integer multiple of a per-super-block float: IQ2 (d/8)*(2s+1)*g*sign,
 * IQ3_XXS (d/4)*(2s+1)*g*sign, IQ3_S d*(2s+1)*g*sign, IQ1 (d/8)*(2s+1)*(8g +- 1),
 * IQ4 d*(s-32)*k. Per super-block the int32 sum of those integers times the activation
 * integers is exact; one float scale follows, as for the K-quants.
 */
#include "quant_impl.h"
#include "quant_iq_tables.h"

static inline int iq_g8(uint64_t e, int k) { return (int)(int8_t)(uint8_t)(e >> (8 * k)); }
static inline int iq_g4(uint32_t e, int k) { return (int)(uint8_t)(e >> (8 * k)); }

/* v = db * g, negated where sign bit k is set (gguf: (db*grid)*sign, sign = +-1: exact) */
static inline float iq_signed(float db, int g, unsigned signs, int k) {
    float v = db * (float)g;
    return (signs >> k) & 1u ? -v : v;
}

/* ---------------------------------------------------------------- IQ2_XXS */

/* {f16 d; u16 qs[32]}: 8 groups of 32 values, each two u32: aux0 = 4 grid indices (bytes),
 * aux1 = 4 x 7 sign bits (cb_iq_ksigns) and the scale s in bits 28..31:
 * db = (d*(0.5 + s))*0.25, v = db*grid[idx_l][k]*sign. */
static void deq_iq2_xxs(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int ib = 0; ib < 8; ib++, y += 32) {
        const uint8_t *g = b + 2 + 8 * ib;
        uint32_t aux1 = cb_rd32(g + 4);
        float db = d * (0.5f + (float)(aux1 >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            uint64_t e = cb_iq2xxs_grid[g[l]];
            unsigned sg = cb_iq_ksigns[(aux1 >> (7 * l)) & 127];
            for (int k = 0; k < 8; k++) y[8 * l + k] = iq_signed(db, iq_g8(e, k), sg, k);
        }
    }
}

static inline int iq_dot8(uint64_t e, unsigned sg, const int8_t *a) {
    int p = 0;
    for (int k = 0; k < 8; k++) p += ((sg >> k) & 1u ? -iq_g8(e, k) : iq_g8(e, k)) * a[k];
    return p;
}

static float dot_iq2_xxs(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 66) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *g = w + 2 + 8 * ib;
            uint32_t aux1 = cb_rd32(g + 4);
            int p = 0;
            for (int l = 0; l < 4; l++)
                p += iq_dot8(cb_iq2xxs_grid[g[l]], cb_iq_ksigns[(aux1 >> (7 * l)) & 127],
                             a[b].qs + 32 * ib + 8 * l);
            sumi += (2 * (int)(aux1 >> 28) + 1) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d * 0.125f) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ2_XS */

/* {f16 d; u16 qs[32]; u8 scales[8]}: qs[i] covers values 8i..8i+7: grid index qs & 511, signs
 * cb_iq_ksigns[qs >> 9]; scale of values 16j..16j+15: nibble j%2 of scales[j/2]. */
static void deq_iq2_xs(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    const uint8_t *sc = b + 66;
    for (int i = 0; i < 32; i++) {
        uint16_t q = cb_rd16(b + 2 + 2 * i);
        float db = d * (0.5f + (float)((sc[i / 4] >> (4 * ((i / 2) & 1))) & 0x0F)) * 0.25f;
        uint64_t e = cb_iq2xs_grid[q & 511];
        unsigned sg = cb_iq_ksigns[q >> 9];
        for (int k = 0; k < 8; k++) y[8 * i + k] = iq_signed(db, iq_g8(e, k), sg, k);
    }
}

static float dot_iq2_xs(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 74) {
        const uint8_t *sc = w + 66;
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int p = 0;
            for (int i = 2 * j; i < 2 * j + 2; i++) {
                uint16_t q = cb_rd16(w + 2 + 2 * i);
                p += iq_dot8(cb_iq2xs_grid[q & 511], cb_iq_ksigns[q >> 9], a[b].qs + 8 * i);
            }
            sumi += (2 * ((sc[j / 2] >> (4 * (j & 1))) & 0x0F) + 1) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d * 0.125f) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ2_S */

/* {f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}: values 8i..8i+7: grid index
 * qs[i] | ((qh[i/4] >> 2(i%4)) & 3) << 8, sign bits signs[i]; scales as IQ2_XS. */
static inline unsigned iq2s_index(const uint8_t *b, int i) {
    return b[2 + i] | ((b[66 + i / 4] >> (2 * (i & 3))) & 3u) << 8;
}

static void deq_iq2_s(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    const uint8_t *sc = b + 74;
    for (int i = 0; i < 32; i++) {
        float db = d * (0.5f + (float)((sc[i / 4] >> (4 * ((i / 2) & 1))) & 0x0F)) * 0.25f;
        uint64_t e = cb_iq2s_grid[iq2s_index(b, i)];
        for (int k = 0; k < 8; k++) y[8 * i + k] = iq_signed(db, iq_g8(e, k), b[34 + i], k);
    }
}

static float dot_iq2_s(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 82) {
        const uint8_t *sc = w + 74;
        int sumi = 0;
        for (int j = 0; j < 16; j++) {
            int p = 0;
            for (int i = 2 * j; i < 2 * j + 2; i++)
                p += iq_dot8(cb_iq2s_grid[iq2s_index(w, i)], w[34 + i], a[b].qs + 8 * i);
            sumi += (2 * ((sc[j / 2] >> (4 * (j & 1))) & 0x0F) + 1) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d * 0.125f) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ3_XXS */

/* {f16 d; u8 qs[64]; u32 scales[8]}: group ib (values 32ib..): aux = scales[ib], 4 x 7 sign bits
 * and s = aux >> 28, db = (d*(0.5 + s))*0.5; values 32ib + 8l + k from the 4-value grid entries
 * qs[8ib + 2l] (k < 4) and qs[8ib + 2l + 1] (k >= 4). */
static void deq_iq3_xxs(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int ib = 0; ib < 8; ib++, y += 32) {
        const uint8_t *qs = b + 2 + 8 * ib;
        uint32_t aux = cb_rd32(b + 66 + 4 * ib);
        float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            unsigned sg = cb_iq_ksigns[(aux >> (7 * l)) & 127];
            for (int k = 0; k < 8; k++)
                y[8 * l + k] = iq_signed(db, iq_g4(cb_iq3xxs_grid[qs[2 * l + k / 4]], k & 3), sg, k);
        }
    }
}

static float dot_iq3_xxs(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 98) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *qs = w + 2 + 8 * ib;
            uint32_t aux = cb_rd32(w + 66 + 4 * ib);
            const int8_t *q8 = a[b].qs + 32 * ib;
            int p = 0;
            for (int l = 0; l < 4; l++) {
                unsigned sg = cb_iq_ksigns[(aux >> (7 * l)) & 127];
                for (int k = 0; k < 8; k++) {
                    int g = iq_g4(cb_iq3xxs_grid[qs[2 * l + k / 4]], k & 3);
                    p += ((sg >> k) & 1u ? -g : g) * q8[8 * l + k];
                }
            }
            sumi += (2 * (int)(aux >> 28) + 1) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d * 0.25f) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ3_S */

/* {f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}: value v: grid entry i = v/4 (index
 * qs[i] | ((qh[i/8] >> i%8) & 1) << 8), component v%4, sign bit v%8 of signs[v/8]; group ib
 * (32 values): s = nibble ib%2 of scales[ib/2], db = d*(1 + 2s). */
static inline int iq3s_value(const uint8_t *b, int v) {
    int i = v >> 2;
    unsigned idx = b[2 + i] | ((b[66 + i / 8] >> (i & 7)) & 1u) << 8;
    return iq_g4(cb_iq3s_grid[idx], v & 3);
}

static void deq_iq3_s(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int v = 0; v < 256; v++) {
        int s = (b[106 + v / 64] >> (4 * ((v / 32) & 1))) & 0x0F;
        float db = d * (float)(1 + 2 * s);
        y[v] = iq_signed(db, iq3s_value(b, v), b[74 + v / 8], v & 7);
    }
}

static float dot_iq3_s(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 110) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            int p = 0;
            for (int v = 32 * ib; v < 32 * ib + 32; v++) {
                int g = iq3s_value(w, v);
                p += ((w[74 + v / 8] >> (v & 7)) & 1 ? -g : g) * a[b].qs[v];
            }
            sumi += (1 + 2 * ((w[106 + ib / 2] >> (4 * (ib & 1))) & 0x0F)) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ1_S, IQ1_M */

/* IQ1_S {f16 d; u8 qs[32]; u16 qh[8]}: group ib (32 values), h = qh[ib]: dl = d*(2((h >> 12) & 7)
 * + 1), delta = -0.125 if bit 15 of h else 0.125; values 32ib + 8l + k: grid entry qs[4ib + l] |
 * ((h >> 3l) & 7) << 8, v = dl*(g + delta). As integers: (8g + 8 delta) (2s + 1) (d/8). */
static void deq_iq1_s(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int ib = 0; ib < 8; ib++, y += 32) {
        uint16_t h = cb_rd16(b + 34 + 2 * ib);
        float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
        float delta = h & 0x8000u ? -0.125f : 0.125f;
        for (int l = 0; l < 4; l++) {
            uint64_t e = cb_iq1s_grid[b[2 + 4 * ib + l] | ((h >> (3 * l)) & 7u) << 8];
            for (int k = 0; k < 8; k++) y[8 * l + k] = dl * ((float)iq_g8(e, k) + delta);
        }
    }
}

/* sum over 8 values of (8g + dsign) * a */
static inline int iq1_dot8(uint64_t e, int dsign, const int8_t *a) {
    int p = 0;
    for (int k = 0; k < 8; k++) p += (8 * iq_g8(e, k) + dsign) * a[k];
    return p;
}

static float dot_iq1_s(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 50) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint16_t h = cb_rd16(w + 34 + 2 * ib);
            int ds = h & 0x8000u ? -1 : 1, p = 0;
            for (int l = 0; l < 4; l++)
                p += iq1_dot8(cb_iq1s_grid[w[2 + 4 * ib + l] | ((h >> (3 * l)) & 7u) << 8], ds,
                              a[b].qs + 32 * ib + 8 * l);
            sumi += (2 * ((h >> 12) & 7) + 1) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d * 0.125f) * (float)sumi;
    }
    return acc;
}

/* IQ1_M {u8 qs[32]; u8 qh[16]; u16 sc[4]}: d is the f16 of the top nibbles of sc[0..3] (sc[0]'s
 * lowest); entry e (values 8e..8e+7): nibble n = qh[e/2] >> 4(e%2), grid index qs[e] | (n & 7)
 * << 8, delta = -0.125 if n & 8 else 0.125; scale of entries 2k, 2k+1 (16 values): s =
 * (sc[k/4] >> 3(k%4)) & 7, dl = d*(2s + 1). */
static inline float iq1m_d(const uint8_t *b) {
    uint16_t s0 = cb_rd16(b + 48), s1 = cb_rd16(b + 50), s2 = cb_rd16(b + 52), s3 = cb_rd16(b + 54);
    return cb_f16_to_f32((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0x00F0u) | ((s2 >> 4) & 0x0F00u) |
                                    (s3 & 0xF000u)));
}

static inline int iq1m_scale(const uint8_t *b, int k) {
    return (cb_rd16(b + 48 + 2 * (k / 4)) >> (3 * (k & 3))) & 7;
}

static void deq_iq1_m(const uint8_t *b, float *y) {
    float d = iq1m_d(b);
    for (int e = 0; e < 32; e++) {
        unsigned n = (b[32 + e / 2] >> (4 * (e & 1))) & 0x0Fu;
        float dl = d * (float)(2 * iq1m_scale(b, e / 2) + 1);
        float delta = n & 8u ? -0.125f : 0.125f;
        uint64_t g = cb_iq1s_grid[b[e] | (n & 7u) << 8];
        for (int k = 0; k < 8; k++) y[8 * e + k] = dl * ((float)iq_g8(g, k) + delta);
    }
}

static float dot_iq1_m(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 56) {
        int sumi = 0;
        for (int k = 0; k < 16; k++) {
            int p = 0;
            for (int e = 2 * k; e < 2 * k + 2; e++) {
                unsigned n = (w[32 + e / 2] >> (4 * (e & 1))) & 0x0Fu;
                p += iq1_dot8(cb_iq1s_grid[w[e] | (n & 7u) << 8], n & 8u ? -1 : 1,
                              a[b].qs + 8 * e);
            }
            sumi += (2 * iq1m_scale(w, k) + 1) * p;
        }
        acc += (iq1m_d(w) * a[b].d * 0.125f) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- IQ4_NL, IQ4_XS */

/* IQ4_NL {f16 d; u8 qs[16]} (32 values, Q4_0's nibble order): v = d*K[q], K = cb_iq4nl_values. */
static void deq_iq4_nl(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)cb_iq4nl_values[b[2 + j] & 0x0F];
        y[j + 16] = d * (float)cb_iq4nl_values[b[2 + j] >> 4];
    }
}

static float dot_iq4_nl(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += cb_iq4nl_values[w[2 + j] & 0x0F] * a[b].qs[j] +
                   cb_iq4nl_values[w[2 + j] >> 4] * a[b].qs[j + 16];
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
    }
    return acc;
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: group ib (32 values): 6-bit scale
 * (nibble ib%2 of scales_l[ib/2]) | ((scales_h >> 2ib) & 3) << 4, dl = d*(scale - 32); values
 * as IQ4_NL's from qs[16ib..16ib+15]. */
static inline int iq4xs_scale(const uint8_t *b, int ib) {
    int lo = (b[4 + ib / 2] >> (4 * (ib & 1))) & 0x0F, hi = (cb_rd16(b + 2) >> (2 * ib)) & 3;
    return (lo | hi << 4) - 32;
}

static void deq_iq4_xs(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    for (int ib = 0; ib < 8; ib++, y += 32) {
        float dl = d * (float)iq4xs_scale(b, ib);
        const uint8_t *qs = b + 8 + 16 * ib;
        for (int j = 0; j < 16; j++) {
            y[j] = dl * (float)cb_iq4nl_values[qs[j] & 0x0F];
            y[j + 16] = dl * (float)cb_iq4nl_values[qs[j] >> 4];
        }
    }
}

static float dot_iq4_xs(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 136) {
        int sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *qs = w + 8 + 16 * ib;
            const int8_t *q8 = a[b].qs + 32 * ib;
            int p = 0;
            for (int j = 0; j < 16; j++)
                p += cb_iq4nl_values[qs[j] & 0x0F] * q8[j] + cb_iq4nl_values[qs[j] >> 4] * q8[j + 16];
            sumi += iq4xs_scale(w, ib) * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sumi;
    }
    return acc;
}

/* ---------------------------------------------------------------- dispatch */

cb_deq_fn cb_iq_deq(int type) {
    switch (type) {
    case CB_TYPE_IQ2_XXS: return deq_iq2_xxs;
    case CB_TYPE_IQ2_XS: return deq_iq2_xs;
    case CB_TYPE_IQ2_S: return deq_iq2_s;
    case CB_TYPE_IQ3_XXS: return deq_iq3_xxs;
    case CB_TYPE_IQ3_S: return deq_iq3_s;
    case CB_TYPE_IQ1_S: return deq_iq1_s;
    case CB_TYPE_IQ1_M: return deq_iq1_m;
    case CB_TYPE_IQ4_NL: return deq_iq4_nl;
    case CB_TYPE_IQ4_XS: return deq_iq4_xs;
    default: return NULL;
    }
}

cb_dot_fn cb_iq_dot(int type) {
    switch (type) {
    case CB_TYPE_IQ2_XXS: return dot_iq2_xxs;
    case CB_TYPE_IQ2_XS: return dot_iq2_xs;
    case CB_TYPE_IQ2_S: return dot_iq2_s;
    case CB_TYPE_IQ3_XXS: return dot_iq3_xxs;
    case CB_TYPE_IQ3_S: return dot_iq3_s;
    case CB_TYPE_IQ1_S: return dot_iq1_s;
    case CB_TYPE_IQ1_M: return dot_iq1_m;
    case CB_TYPE_IQ4_NL: return dot_iq4_nl;
    case CB_TYPE_IQ4_XS: return dot_iq4_xs;
    default: return NULL;
    }
}
