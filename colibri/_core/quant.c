/* GGUF block types: type table, scalar dequantizers, activation quantizers and dot products,
 * the run-time dispatch to SIMD kernels, and the drivers cb_matmul / cb_get_rows.
 *
 * Math (shared by every SIMD level, see quant.h): activations are quantized once per call to
 * cb_q8a_t (32-blocks) or cb_q8k_t (256-blocks), products of integer blocks are summed exactly
 * in int32 and scaled in float per block. The scalar kernels here are the reference the SIMD
 * kernels must agree with (up to float summation order).
 * Dequantizers follow gguf-py's float32 operation order exactly (no FMA contraction: this file
 * is compiled with -std=c11, where GCC does not contract), so that they match bit for bit.
 * Ownership: every pointer is borrowed for one call; cb_matmul's activation buffer is the
 * pool's scratch (or one malloc per call without a pool).
 */
#include "matmul_impl.h"
#include "quant_r16.h"

#include <math.h>
#include <stdlib.h>

#include "colibri/cpu.h"
#include "threadpool_impl.h"

#include "alloc.h"

/* ---------------------------------------------------------------- type table */

typedef struct {
    int id;
    const char *name;
    int64_t block_size;
    size_t block_bytes;
    int supported;
} type_info;

static const type_info TYPES[] = {
    {CB_TYPE_F32, "F32", 1, 4, 1},        {CB_TYPE_F16, "F16", 1, 2, 1},
    {CB_TYPE_Q4_0, "Q4_0", 32, 18, 1},    {CB_TYPE_Q4_1, "Q4_1", 32, 20, 1},
    {CB_TYPE_Q5_0, "Q5_0", 32, 22, 1},    {CB_TYPE_Q5_1, "Q5_1", 32, 24, 1},
    {CB_TYPE_Q8_0, "Q8_0", 32, 34, 1},    {CB_TYPE_Q8_1, "Q8_1", 32, 40, 0},
    {CB_TYPE_Q2_K, "Q2_K", 256, 84, 1},   {CB_TYPE_Q3_K, "Q3_K", 256, 110, 1},
    {CB_TYPE_Q4_K, "Q4_K", 256, 144, 1},  {CB_TYPE_Q5_K, "Q5_K", 256, 176, 1},
    {CB_TYPE_Q6_K, "Q6_K", 256, 210, 1},  {CB_TYPE_Q8_K, "Q8_K", 256, 292, 1},
    {CB_TYPE_IQ2_XXS, "IQ2_XXS", 256, 66, 1}, {CB_TYPE_IQ2_XS, "IQ2_XS", 256, 74, 1},
    {CB_TYPE_IQ3_XXS, "IQ3_XXS", 256, 98, 1}, {CB_TYPE_IQ1_S, "IQ1_S", 256, 50, 1},
    {CB_TYPE_IQ4_NL, "IQ4_NL", 32, 18, 1}, {CB_TYPE_IQ3_S, "IQ3_S", 256, 110, 1},
    {CB_TYPE_IQ2_S, "IQ2_S", 256, 82, 1}, {CB_TYPE_IQ4_XS, "IQ4_XS", 256, 136, 1},
    {CB_TYPE_IQ1_M, "IQ1_M", 256, 56, 1}, {CB_TYPE_TQ1_0, "TQ1_0", 256, 54, 1},
    {CB_TYPE_TQ2_0, "TQ2_0", 256, 66, 1},
    {CB_TYPE_BF16, "BF16", 1, 2, 1},      {CB_TYPE_MXFP4, "MXFP4", 32, 17, 1},
    {CB_TYPE_I4_G128, "I4_G128", 128, 66, 1}, {CB_TYPE_Q8_0_R16, "Q8_0_R16", 32, 34, 1},
    {CB_TYPE_Q5_0_R16, "Q5_0_R16", 32, 22, 1}, {CB_TYPE_Q6_K_R16, "Q6_K_R16", 256, 210, 1},
    {CB_TYPE_Q4_K_R16, "Q4_K_R16", 256, 144, 1},
};

static const type_info *type_get(int type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].id == type) return &TYPES[i];
    return NULL;
}

int64_t cb_type_block_size(int type) {
    const type_info *t = type_get(type);
    return t ? t->block_size : 0;
}

size_t cb_type_block_bytes(int type) {
    const type_info *t = type_get(type);
    return t ? t->block_bytes : 0;
}

const char *cb_type_name(int type) {
    const type_info *t = type_get(type);
    return t ? t->name : "unknown";
}

int cb_type_supported(int type) {
    const type_info *t = type_get(type);
    return t ? t->supported : 0;
}

cb_status cb_type_row_bytes(int type, int64_t n, size_t *out) {
    const type_info *t = type_get(type);
    if (!out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "type_row_bytes: out is NULL");
    *out = 0;
    if (!t) return cb_fail(CB_STATUS_UNSUPPORTED, "unknown GGML type id %d", type);
    if (n < 0) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "row of %lld values", (long long)n);
    if (n % t->block_size != 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "%s: a row of %lld values is not a multiple of the block size %lld",
                       t->name, (long long)n, (long long)t->block_size);
    uint64_t blocks = (uint64_t)(n / t->block_size);
    if (blocks > SIZE_MAX / t->block_bytes)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "%s: row of %lld values overflows", t->name,
                       (long long)n);
    *out = (size_t)blocks * t->block_bytes;
    return CB_OK;
}

cb_status cb_matrix_check(const cb_matrix_t *w) {
    if (!w) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matrix is NULL");
    const type_info *t = type_get(w->type);
    if (!t) return cb_fail(CB_STATUS_UNSUPPORTED, "unknown GGML type id %d", w->type);
    if (!t->supported)
        return cb_fail(CB_STATUS_UNSUPPORTED, "type %s has no kernels", t->name);
    if (w->rows < 0 || w->cols < 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matrix shape %lld x %lld is negative",
                       (long long)w->rows, (long long)w->cols);
    size_t rb;
    cb_status s = cb_type_row_bytes(w->type, w->cols, &rb);
    if (s != CB_OK) return s;
    if (cb_r16_source(w->type) && w->row_bytes != rb)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "%s matrix: row stride %zu bytes, not the "
                       "layout's %zu", t->name, w->row_bytes, rb);
    if (w->row_bytes < rb)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "%s matrix: row stride %zu bytes < %zu bytes of a %lld-value row", t->name,
                       w->row_bytes, rb, (long long)w->cols);
    if (!w->data && w->rows > 0 && rb > 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matrix data is NULL");
    return CB_OK;
}

/* ---------------------------------------------------------------- scalars */

float cb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: man * 2^-24, exact in float */
            float f = (float)man * 5.9604644775390625e-08f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t cb_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7FFFFFFFu;
    if (x >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u));
    if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to infinity */
    if (x < 0x38800000u) {                                   /* below 2^-14: subnormal */
        float a;
        memcpy(&a, &x, 4);
        float r = nearbyintf(a * 16777216.0f); /* exact scaling, ties to even */
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t h = ((x >> 23) - 112u) << 10 | ((x & 0x7FFFFFu) >> 13);
    uint32_t rem = x & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float cb_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

const int8_t cb_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ---------------------------------------------------------------- dequantize (scalar) */

static void deq_f32(const uint8_t *b, float *y) { memcpy(y, b, 4); }
static void deq_f16(const uint8_t *b, float *y) { *y = cb_f16_to_f32(cb_rd16(b)); }
static void deq_bf16(const uint8_t *b, float *y) { *y = cb_bf16_to_f32(cb_rd16(b)); }

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0x0F) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b)), m = cb_f16_to_f32(cb_rd16(b + 2));
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0F) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    uint32_t qh = cb_rd32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)(lo - 16);
        y[j + 16] = d * (float)(hi - 16);
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b)), m = cb_f16_to_f32(cb_rd16(b + 2));
    uint32_t qh = cb_rd32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)lo + m;
        y[j + 16] = d * (float)hi + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static void deq_mxfp4(const uint8_t *b, float *y) {
    float d = cb_e8m0_half(b[0]);
    const uint8_t *qs = b + 1;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)cb_mxfp4_values[qs[j] & 0x0F];
        y[j + 16] = d * (float)cb_mxfp4_values[qs[j] >> 4];
    }
}

static void deq_i4g128(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b));
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 64; i++) {
        y[2 * i] = d * (float)((qs[i] & 0x0F) - 8);
        y[2 * i + 1] = d * (float)((qs[i] >> 4) - 8);
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b)), dmin = cb_f16_to_f32(cb_rd16(b + 2));
    const uint8_t *sc = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        cb_scale_min_k4(j, sc, &s, &m);
        float dl = d * (float)s, ml = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        int shift = (j & 1) * 4;
        for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)((q[l] >> shift) & 0x0F) - ml;
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    float d = cb_f16_to_f32(cb_rd16(b)), dmin = cb_f16_to_f32(cb_rd16(b + 2));
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        cb_scale_min_k4(j, sc, &s, &m);
        float dl = d * (float)s, ml = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        int shift = (j & 1) * 4;
        for (int l = 0; l < 32; l++) {
            int v = ((q[l] >> shift) & 0x0F) | ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = dl * (float)v - ml;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = cb_f16_to_f32(cb_rd16(b + 208));
    for (int i = 0; i < 256; i++) y[i] = (d * (float)sc[i / 16]) * (float)cb_q6k_value(ql, qh, i);
}

typedef void (*deq_fn)(const uint8_t *b, float *y);

static deq_fn deq_for(int type) {
    switch (type) {
    case CB_TYPE_F32: return deq_f32;
    case CB_TYPE_F16: return deq_f16;
    case CB_TYPE_BF16: return deq_bf16;
    case CB_TYPE_Q4_0: return deq_q4_0;
    case CB_TYPE_Q4_1: return deq_q4_1;
    case CB_TYPE_Q5_0: return deq_q5_0;
    case CB_TYPE_Q5_1: return deq_q5_1;
    case CB_TYPE_Q8_0: return deq_q8_0;
    case CB_TYPE_MXFP4: return deq_mxfp4;
    case CB_TYPE_I4_G128: return deq_i4g128;
    case CB_TYPE_Q4_K: return deq_q4_k;
    case CB_TYPE_Q5_K: return deq_q5_k;
    case CB_TYPE_Q6_K: return deq_q6_k;
    default: return cb_lowbit_deq(type); /* quant_lowbit.c, quant_iq.c */
    }
}

static void dequantize_unchecked(int type, const uint8_t *src, int64_t n, float *dst) {
    const type_info *t = type_get(type);
    deq_fn f = deq_for(type);
    if (type == CB_TYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    int64_t nb = n / t->block_size;
    for (int64_t i = 0; i < nb; i++) f(src + i * t->block_bytes, dst + i * t->block_size);
}

cb_status cb_dequantize_rows(int type, const void *src, int64_t n_values, float *dst) {
    size_t rb;
    cb_status s = cb_type_row_bytes(type, n_values, &rb);
    if (s != CB_OK) return s;
    if (!cb_type_supported(type) || cb_r16_source(type))
        return cb_fail(CB_STATUS_UNSUPPORTED, "dequantize: type %s %s", cb_type_name(type),
                       cb_r16_source(type) ? "is a 16-row layout: read its rows with get_rows"
                                           : "has no kernels");
    if (n_values == 0) return CB_OK;
    if (!src || !dst) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "dequantize: NULL buffer");
    dequantize_unchecked(type, src, n_values, dst);
    return CB_OK;
}

cb_status cb_get_rows(const cb_matrix_t *w, const int32_t *ids, int64_t n, float *out) {
    cb_status s = cb_matrix_check(w);
    if (s != CB_OK) return s;
    if (n < 0) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "get_rows: n %lld < 0", (long long)n);
    if (n == 0) return CB_OK;
    if (!ids || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "get_rows: NULL buffer");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->rows)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "get_rows: id %d at position %lld is out of range [0, %lld)",
                           (int)ids[i], (long long)i, (long long)w->rows);
    for (int64_t i = 0; i < n; i++) {
        if (cb_r16_source(w->type))
            cb_r16_get_row(w, ids[i], out + i * w->cols);
        else
            dequantize_unchecked(w->type, (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes,
                                 w->cols, out + i * w->cols);
    }
    return CB_OK;
}

cb_status cb_quantize_q8_0(const float *x, int64_t n, void *dst) {
    if (n < 0 || n % 32 != 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "quantize_q8_0: %lld values is not a multiple of the block size 32",
                       (long long)n);
    if (n == 0) return CB_OK;
    if (!x || !dst) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "quantize_q8_0: NULL buffer");
    uint8_t *o = dst;
    for (int64_t b = 0; b < n / 32; b++, o += 34) {
        const float *v = x + b * 32;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = cb_f32_to_f16(d);
        memcpy(o, &dh, 2);
        for (int j = 0; j < 32; j++) {
            float q = roundf(v[j] * id);
            q = q > 127.0f ? 127.0f : (q < -128.0f ? -128.0f : q);
            o[2 + j] = (uint8_t)(int8_t)(q == q ? q : 0.0f);
        }
    }
    return CB_OK;
}

cb_status cb_quantize_i4g128(const float *src, int64_t n, void *dst) {
    if (n < 0 || n % 128 != 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "quantize_i4g128: %lld values is not a multiple of the group size 128",
                       (long long)n);
    if (n == 0) return CB_OK;
    if (!src || !dst) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "quantize_i4g128: NULL buffer");
    /* check everything first: on failure dst is untouched */
    for (int64_t g = 0; g < n / 128; g++) {
        const float *v = src + g * 128;
        float amax = 0.0f;
        for (int j = 0; j < 128; j++) {
            if (!isfinite(v[j]))
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "quantize_i4g128: value %lld is not finite", (long long)(g * 128 + j));
            amax = fmaxf(amax, fabsf(v[j]));
        }
        if ((cb_f32_to_f16(amax / 7.0f) & 0x7C00u) == 0x7C00u)
            return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                           "quantize_i4g128: group %lld: scale max|x|/7 = %g overflows f16",
                           (long long)g, (double)(amax / 7.0f));
    }
    uint8_t *o = dst;
    for (int64_t g = 0; g < n / 128; g++, o += 66) {
        const float *v = src + g * 128;
        float amax = 0.0f;
        for (int j = 0; j < 128; j++) amax = fmaxf(amax, fabsf(v[j]));
        uint16_t dh = cb_f32_to_f16(amax / 7.0f);
        float d = cb_f16_to_f32(dh);
        memcpy(o, &dh, 2);
        for (int i = 0; i < 64; i++) {
            int q[2];
            for (int k = 0; k < 2; k++) {
                float r = d > 0.0f ? nearbyintf(v[2 * i + k] / d) : 0.0f;
                r = r < -8.0f ? -8.0f : (r > 7.0f ? 7.0f : r);
                q[k] = (int)r + 8;
            }
            o[2 + i] = (uint8_t)(q[0] | q[1] << 4);
        }
    }
    return CB_OK;
}

/* ---------------------------------------------------------------- activations (scalar) */

static inline int8_t act_round(float v) {
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    if (v != v) v = 0.0f;
    return (int8_t)nearbyintf(v);
}

static void quantize_q8a_scalar(const float *x, int64_t n, void *dst) {
    cb_q8a_t *o = dst;
    for (int64_t b = 0; b < n / CB_QK; b++) {
        const float *v = x + b * CB_QK;
        float amax = 0.0f;
        for (int j = 0; j < CB_QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < CB_QK; j++) {
            o[b].qs[j] = act_round(v[j] * id);
            sum += o[b].qs[j];
        }
        o[b].d = d;
        o[b].isum = sum;
        o[b].s = d * (float)sum;
    }
}

static void quantize_q8k_scalar(const float *x, int64_t n, void *dst) {
    cb_q8k_t *o = dst;
    for (int64_t b = 0; b < n / CB_QKK; b++) {
        const float *v = x + b * CB_QKK;
        float amax = 0.0f;
        for (int j = 0; j < CB_QKK; j++) amax = fmaxf(amax, fabsf(v[j]));
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        o[b].d = amax / 127.0f;
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                o[b].qs[j] = act_round(v[j] * id);
                sum += o[b].qs[j];
            }
            o[b].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---------------------------------------------------------------- dot products (scalar) */

static float dot_f32(int64_t n, const uint8_t *w, const uint8_t *x) {
    const float *xf = (const float *)(const void *)x;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, w + 4 * i, 4);
        acc += v * xf[i];
    }
    return acc;
}

static float dot_f16(int64_t n, const uint8_t *w, const uint8_t *x) {
    const float *xf = (const float *)(const void *)x;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += cb_f16_to_f32(cb_rd16(w + 2 * i)) * xf[i];
    return acc;
}

static float dot_bf16(int64_t n, const uint8_t *w, const uint8_t *x) {
    const float *xf = (const float *)(const void *)x;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += cb_bf16_to_f32(cb_rd16(w + 2 * i)) * xf[i];
    return acc;
}

static float dot_q4_0(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 18) {
        const uint8_t *qs = w + 2;
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += ((qs[j] & 0x0F) - 8) * a[b].qs[j] + ((qs[j] >> 4) - 8) * a[b].qs[j + 16];
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
    }
    return acc;
}

static float dot_q4_1(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 20) {
        const uint8_t *qs = w + 4;
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += (qs[j] & 0x0F) * a[b].qs[j] + (qs[j] >> 4) * a[b].qs[j + 16];
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
        acc += cb_f16_to_f32(cb_rd16(w + 2)) * a[b].s;
    }
    return acc;
}

static float dot_q5_0(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 22) {
        uint32_t qh = cb_rd32(w + 2);
        const uint8_t *qs = w + 6;
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = ((qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4) - 16;
            int hi = ((qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4) - 16;
            sum += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
    }
    return acc;
}

static float dot_q5_1(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 24) {
        uint32_t qh = cb_rd32(w + 4);
        const uint8_t *qs = w + 8;
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1u) << 4;
            int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
            sum += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
        acc += cb_f16_to_f32(cb_rd16(w + 2)) * a[b].s;
    }
    return acc;
}

static float dot_q8_0(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 34) {
        const int8_t *qs = (const int8_t *)(w + 2);
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += qs[j] * a[b].qs[j];
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sum;
    }
    return acc;
}

static float dot_mxfp4(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 17) {
        const uint8_t *qs = w + 1;
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += cb_mxfp4_values[qs[j] & 0x0F] * a[b].qs[j] +
                   cb_mxfp4_values[qs[j] >> 4] * a[b].qs[j + 16];
        acc += (cb_e8m0_half(w[0]) * a[b].d) * (float)sum;
    }
    return acc;
}

/* nb counts activation blocks of 32: four per I4_G128 block. */
static float dot_i4g128(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (b / 4) * 66, *qs = blk + 2 + 16 * (b % 4);
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += ((qs[i] & 0x0F) - 8) * a[b].qs[2 * i] + ((qs[i] >> 4) - 8) * a[b].qs[2 * i + 1];
        acc += (cb_f16_to_f32(cb_rd16(blk)) * a[b].d) * (float)sum;
    }
    return acc;
}

static float dot_q4_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 144) {
        const uint8_t *sc = w + 4, *qs = w + 16;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t s, m;
            cb_scale_min_k4(j, sc, &s, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            int shift = (j & 1) * 4, p = 0;
            for (int l = 0; l < 32; l++) p += ((q[l] >> shift) & 0x0F) * a[b].qs[32 * j + l];
            sumi += s * p;
            summ += m * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sumi;
        acc -= (cb_f16_to_f32(cb_rd16(w + 2)) * a[b].d) * (float)summ;
    }
    return acc;
}

static float dot_q5_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 176) {
        const uint8_t *sc = w + 4, *qh = w + 16, *qs = w + 48;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t s, m;
            cb_scale_min_k4(j, sc, &s, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            int shift = (j & 1) * 4, p = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0x0F) | ((qh[l] >> j) & 1) << 4;
                p += v * a[b].qs[32 * j + l];
            }
            sumi += s * p;
            summ += m * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
        }
        acc += (cb_f16_to_f32(cb_rd16(w)) * a[b].d) * (float)sumi;
        acc -= (cb_f16_to_f32(cb_rd16(w + 2)) * a[b].d) * (float)summ;
    }
    return acc;
}

static float dot_q6_k(int64_t nb, const uint8_t *w, const uint8_t *x) {
    const cb_q8k_t *a = (const cb_q8k_t *)(const void *)x;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        int sumi = 0;
        for (int g = 0; g < 16; g++) {
            int p = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++) p += cb_q6k_value(ql, qh, i) * a[b].qs[i];
            sumi += sc[g] * p;
        }
        acc += (cb_f16_to_f32(cb_rd16(w + 208)) * a[b].d) * (float)sumi;
    }
    return acc;
}

typedef float (*dot_fn)(int64_t n, const uint8_t *w, const uint8_t *x);

static dot_fn dot_for(int type) {
    switch (type) {
    case CB_TYPE_F32: return dot_f32;
    case CB_TYPE_F16: return dot_f16;
    case CB_TYPE_BF16: return dot_bf16;
    case CB_TYPE_Q4_0: return dot_q4_0;
    case CB_TYPE_Q4_1: return dot_q4_1;
    case CB_TYPE_Q5_0: return dot_q5_0;
    case CB_TYPE_Q5_1: return dot_q5_1;
    case CB_TYPE_Q8_0: return dot_q8_0;
    case CB_TYPE_MXFP4: return dot_mxfp4;
    case CB_TYPE_I4_G128: return dot_i4g128;
    case CB_TYPE_Q4_K: return dot_q4_k;
    case CB_TYPE_Q5_K: return dot_q5_k;
    case CB_TYPE_Q6_K: return dot_q6_k;
    default: return cb_lowbit_dot(type); /* quant_lowbit.c, quant_iq.c */
    }
}

static cb_act_kind act_for(int type) {
    switch (type) {
    case CB_TYPE_F32:
    case CB_TYPE_F16:
    case CB_TYPE_BF16: return CB_ACT_F32;
    case CB_TYPE_Q4_K:
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K:
    case CB_TYPE_Q6_K_R16:
    case CB_TYPE_Q4_K_R16: return CB_ACT_Q8K;
    default: return cb_type_block_size(type) == CB_QKK ? CB_ACT_Q8K : CB_ACT_Q8A; /* low-bit */
    }
}

/* The scalar kernels for tests of the SIMD ones (quant_impl.h). */
cb_dot_fn cb_scalar_dot(int type) { return dot_for(type); }
void cb_scalar_quantize_q8a(const float *x, int64_t n, void *dst) { quantize_q8a_scalar(x, n, dst); }
void cb_scalar_quantize_q8k(const float *x, int64_t n, void *dst) { quantize_q8k_scalar(x, n, dst); }

/* ---------------------------------------------------------------- packed-row kernels */

static size_t rp_k_none(int type, int64_t cols) {
    (void)type;
    (void)cols;
    return 0;
}

cb_rp_kernel_t cb_rp_kernel(int type, int simd_level) {
    cb_rp_kernel_t k = {0, 0, rp_k_none, NULL, NULL};
    if (simd_level < CB_SIMD_AVX2 || !cb_avx2_rp_supported(type)) return k;
    if (simd_level >= CB_SIMD_AVX512_VNNI) {
        /* 16 rows per group: quant_avx512.c rpv16_tile, quant_avx512_k.c rpkv16_tile */
        k.rows = 16;
        k.tokens = 4;
        k.group_bytes = cb_avx2_rp16_group_bytes;
        k.pack = cb_avx512_rp16_pack; /* quant_avx512_pack.c: cb_avx2_rp16_pack's bytes */
        k.tile = cb_avx512_rp16_tile_vnni;
        return k;
    }
    k.rows = 8;
    k.tokens = 4;
    k.group_bytes = cb_avx2_rp_group_bytes;
    k.pack = cb_avx2_rp_pack;
    k.tile = simd_level >= CB_SIMD_AVX512_VNNI ? cb_avx512_rp_tile_vnni
             : simd_level >= CB_SIMD_AVX512    ? cb_avx512_rp_tile
                                               : cb_avx2_rp_tile;
    return k;
}

/* ---------------------------------------------------------------- drivers */

/* Batches from this many tokens take the packed-row path where there is one. Packing costs
 * about one pass over the weights per call, so it pays once enough tokens share it. Measured
 * on expert-sized matrices (768 x 2048 and 2048 x 768; packed on against off, CPU time of one
 * thread; `python tools/bench/kernels.py --parts packed`). With AVX2 only: Q4_K's packed tile
 * gains least over its direct one and wins from about 24 tokens, Q5_K/Q6_K from about 8, Q8_0
 * from 5, the rest from 4. With AVX-512 the packed tile is the 512-bit one (and with VNNI the
 * 32-block types' vpdpbusd one) while the invariant direct tiles stay AVX2, so packing wins
 * much earlier (2-core AVX-512 VNNI EPYC, 2026-12-01, time ratio packed / direct at 1-32
 * tokens): Q4_K and Q5_K from 5 tokens (0.86-0.94 at 5, 0.54-0.59 at 16), Q6_K from 3-4 (0.87-
 * 0.90 at 4), Q8_0 and Q4_0/Q5_0 from 2 (0.77-0.86 at 2, 0.57-0.66 at 3). With the 16-row VNNI
 * tiles (same machine, loaded, 1 thread): Q4_K 0.82-0.86 at 4 tokens, Q6_K 0.89-0.90 at 4, Q8_0
 * 0.79-0.84 at 2, Q5_0 0.69-0.70 at 2. MoE prefill lives
 * in this range: 64 prompt tokens over 128 experts, top-8, give 4 tokens per expert call;
 * 256 give 16. The results do not depend on the path (batch invariance). Since the K-quants'
 * invariant direct tiles are AVX-512 (quant_avx512_k.c) and the 16-row packing too
 * (quant_avx512_pack.c), with weights from memory as experts are (64 distinct 768x2048 Q4_K /
 * 2048x768 Q6_K, 1 thread, quiet, 2026-12-01 23:50), packed / direct time: Q4_K 1.52 at 3
 * tokens, 1.19 at 4, 0.84 at 5; Q6_K 1.61, 1.44, 0.92: both from 5 (`kernels.py --parts
 * packed` measures this way; one weight reused from cache had packing win from 2-3). */
static int rp_min_tokens(int type, cb_simd_level level) {
    if (level >= CB_SIMD_AVX512) {
        switch (type) {
        case CB_TYPE_Q4_K:
        case CB_TYPE_Q5_K:
        case CB_TYPE_Q6_K: return 5;
        default: return level >= CB_SIMD_AVX512_VNNI ? 2 : (type == CB_TYPE_Q8_0 ? 5 : 4);
        }
    }
    switch (type) {
    case CB_TYPE_Q4_K: return 16; /* packing wins from 12-16 tokens (docs/benchmarks.md) */
    case CB_TYPE_Q5_K:
    case CB_TYPE_Q6_K: return 8;
    case CB_TYPE_Q8_0: return 5;
    default: return 4;
    }
}

int cb_mm_packed(int type, int64_t n_tokens, int packed) {
    cb_simd_level level = cb_cpu_level();
    return cb_rp_kernel(type, level).rows > 0 &&
           (packed > 0 || (packed == 0 && n_tokens >= rp_min_tokens(type, level)));
}

void cb_mm_plan(cb_mm_ctx *c, const cb_matrix_t *w, int fast, int rp) {
    cb_simd_level level = cb_cpu_level();
    memset(c, 0, sizeof *c);
    c->w = w->data;
    c->w_stride = w->row_bytes;
    c->rows = w->rows;
    c->cols = w->cols;
    c->type = w->type;
    c->dot = dot_for(w->type);
    if (cb_r16_source(w->type)) { /* the packed-row path on the matrix's own groups */
        cb_r16_plan(c, w, level);
        return;
    }
    /* batch invariance (fast == 0): the direct tiles that sum in the packed tiles' order: the
     * AVX2 ones, and the AVX-512 ones of the K-quants (quant_avx512_k.c) and, with VNNI, of the
     * 32-block types (quant_avx512.c, tile32i): the same integers and float order; the other
     * AVX-512 direct tiles (lanes of partial sums) only when asked to be fast */
    c->avx512 = level >= CB_SIMD_AVX512;
    c->tile = NULL;
    if (c->avx512)
        c->tile = fast ? cb_avx512_tile(w->type)
                       : cb_avx512_tile_invariant(w->type, level >= CB_SIMD_AVX512_VNNI);
    if (!c->tile && c->avx512) /* exact: both modes */
        c->tile = cb_avx512_lowbit_tile(w->type, level >= CB_SIMD_AVX512_VNNI);
    if (!c->tile && level >= CB_SIMD_AVX2)
        c->tile = fast ? cb_avx2_tile_fast(w->type) : cb_avx2_tile(w->type);
    c->rk = cb_rp_kernel(w->type, level);
    c->rp = rp && c->rk.rows > 0;
    cb_act_kind ak = act_for(w->type);
    if (ak == CB_ACT_F32) {
        c->kn = w->cols;
        c->act_stride = (size_t)w->cols * 4;
    } else if (ak == CB_ACT_Q8A) {
        c->kn = w->cols / CB_QK;
        c->act_stride = (size_t)c->kn * sizeof(cb_q8a_t);
        c->act = c->avx512 ? cb_avx512_quantize_q8a
                 : (level >= CB_SIMD_AVX2 ? cb_avx2_quantize_q8a : quantize_q8a_scalar);
        if (c->rp) {
            c->act_stride = cb_avx2_rp_act_stride(w->cols);
            c->act = NULL; /* planar activations: cb_avx2_rp_quantize */
            c->rpq = c->avx512 ? cb_avx512_rp_quantize : cb_avx2_rp_quantize;
        }
    } else {
        c->kn = w->cols / CB_QKK;
        c->act_stride = (size_t)c->kn * sizeof(cb_q8k_t);
        c->act = c->avx512 ? cb_avx512_quantize_q8k
                 : (level >= CB_SIMD_AVX2 ? cb_avx2_quantize_q8k : quantize_q8k_scalar);
    }
    if (c->rp) c->pack_stride = (c->rk.group_bytes(w->type, w->cols) + 63) / 64 * 64;
}

size_t cb_mm_act_bound(int type, int64_t cols) {
    cb_act_kind ak = act_for(type);
    size_t b = ak == CB_ACT_F32   ? (size_t)cols * 4
               : ak == CB_ACT_Q8A ? (size_t)(cols / CB_QK) * sizeof(cb_q8a_t)
                                  : (size_t)(cols / CB_QKK) * sizeof(cb_q8k_t);
    if (cb_avx2_rp_supported(type) && cb_avx2_rp_act_stride(cols) > b)
        b = cb_avx2_rp_act_stride(cols);
    if (cb_r16_act_stride(type, cols) > b) b = cb_r16_act_stride(type, cols);
    return (b + 63) / 64 * 64;
}

size_t cb_mm_pack_bound(int type, int64_t cols) {
    if (!cb_avx2_rp_supported(type)) return 0;
    size_t b8 = cb_avx2_rp_group_bytes(type, cols), b16 = cb_avx2_rp16_group_bytes(type, cols);
    return ((b8 > b16 ? b8 : b16) + 63) / 64 * 64; /* 8- or 16-row groups (cb_rp_kernel) */
}

void cb_mm_prep_row(const cb_mm_ctx *c, const float *x, uint8_t *dst) {
    if (c->act)
        c->act(x, c->cols, dst);
    else if (c->rp)
        c->rpq(c->type, x, c->cols, dst);
    else
        memcpy(dst, x, (size_t)c->cols * 4);
}

/* Where a tile of nt == 1 may write its nr outputs straight into y (a decode row: y's rows r0..
 * are out's layout), or NULL: the tile writes a local buffer that mm_store then copies. Writing
 * in place saves a library memcpy call a tile (16 384 a token on Gemma's head). */
static inline float *mm_direct_out(const cb_mm_ctx *c, int64_t r0, int64_t t0, int nt) {
    if (nt != 1 || c->token_ids || c->token_scale || c->accumulate) return NULL;
    return c->y + t0 * c->y_stride + r0;
}

static inline void mm_store(const cb_mm_ctx *c, int64_t r0, int nr, int64_t t0, int nt,
                            const float *out) {
    float *row = mm_direct_out(c, r0, t0, nt);
    if (row) { /* a decode row (a partial tile or group) */
        memcpy(row, out, sizeof(float) * (size_t)nr);
        return;
    }
    for (int t = 0; t < nt; t++) {
        int64_t tt = t0 + t;
        int64_t yrow = c->token_ids ? c->token_ids[tt] : tt;
        float s = c->token_scale ? c->token_scale[tt] : 1.0f;
        float *y = c->y + yrow * c->y_stride + r0;
        if (c->accumulate) {
            for (int r = 0; r < nr; r++) y[r] += s * out[r * nt + t];
        } else if (c->token_scale) {
            for (int r = 0; r < nr; r++) y[r] = s * out[r * nt + t];
        } else {
            for (int r = 0; r < nr; r++) y[r] = out[r * nt + t];
        }
    }
}

#define MM_CHUNK 16
#ifndef MM_TASKS_PER_THREAD
#define MM_TASKS_PER_THREAD 16
#endif

/* Direct tiles: chunks of MM_CHUNK rows meet every token while in cache. */
static void mm_rows_direct(const cb_mm_ctx *c, int64_t r_begin, int64_t r_end) {
    float out[CB_TILE_OUT];
    for (int64_t c0 = r_begin; c0 < r_end; c0 += MM_CHUNK) {
    int64_t c1 = c0 + MM_CHUNK < r_end ? c0 + MM_CHUNK : r_end;
    for (int64_t t0 = 0; t0 < c->n_tokens; t0 += CB_TILE_T) {
        int nt = c->n_tokens - t0 < CB_TILE_T ? (int)(c->n_tokens - t0) : CB_TILE_T;
        const int tr = nt == 1 ? CB_TILE_R1 : CB_TILE_R;
        const uint8_t *x = c->xa + t0 * c->xa_stride;
        for (int64_t r0 = c0; r0 < c1; r0 += tr) {
            int nr = c1 - r0 < tr ? (int)(c1 - r0) : tr;
            const uint8_t *w = c->w + r0 * c->w_stride;
            /* a full tile writes its rows in place */
            float *y = c->tile && nr == tr ? mm_direct_out(c, r0, t0, nt) : NULL;
            if (c->tile) {
                c->tile(c->kn, w, c->w_stride, nr, x, c->xa_stride, nt, y ? y : out);
            } else {
                for (int r = 0; r < nr; r++)
                    for (int t = 0; t < nt; t++)
                        out[r * nt + t] =
                            c->dot(c->kn, w + r * c->w_stride, x + t * c->xa_stride);
            }
            if (!y) mm_store(c, r0, nr, t0, nt, out);
        }
    }
    }
}

/* Packed-row path: each group of rows (c->rk.rows) is unpacked once into this thread's buffer
 * (an R16 matrix: read in place), then meets every token, c->rk.tokens at a time. */
static void mm_rows_rp(const cb_mm_ctx *c, int64_t r_begin, int64_t r_end, int thread) {
    uint8_t *buf = c->prepacked ? NULL : c->pack + (size_t)thread * c->pack_stride;
    float out[CB_RP_MAX_ROWS * CB_RP_MAX_TOKENS];
    const int G = c->rk.rows, T = c->rk.tokens;
    const int64_t n_tiles = (c->n_tokens + T - 1) / T;
    for (int64_t r0 = r_begin; r0 < r_end; r0 += G) {
        int nr = r_end - r0 < G ? (int)(r_end - r0) : G;
        /* the next group's bytes (contiguous) go into L2 while this group meets the tokens,
         * spread over the token tiles (a burst of prefetches stalls on the fill buffers): the
         * rows the next pack reads, or the next R16 group when there are several tiles */
        const uint8_t *pk, *nx;
        size_t pf_bytes = 0;
        if (c->prepacked) {
            pk = c->w + (size_t)(r0 / G) * c->w_group;
            nx = pk + c->w_group;
            if (r0 + G < c->rows && n_tiles > 1) pf_bytes = c->w_group;
        } else {
            c->rk.pack(c->type, c->w + r0 * c->w_stride, c->w_stride, nr, c->cols, buf);
            pk = buf;
            nx = c->w + (r0 + G) * c->w_stride;
            int64_t nn = r0 + G < c->rows ? (c->rows - (r0 + G) < G ? c->rows - (r0 + G) : G) : 0;
            pf_bytes = (size_t)nn * c->w_stride;
        }
        const size_t pf_step = (pf_bytes / (size_t)n_tiles + 63) / 64 * 64;
        size_t pf_at = 0;
        for (int64_t t0 = 0; t0 < c->n_tokens; t0 += T) {
            int nt = c->n_tokens - t0 < T ? (int)(c->n_tokens - t0) : T;
            size_t pf_end = t0 + T >= c->n_tokens ? pf_bytes : pf_at + pf_step;
            for (; pf_at < pf_end && pf_at < pf_bytes; pf_at += 64) __builtin_prefetch(nx + pf_at, 0, 2);
            /* a packed tile writes all G rows: in place only for a full group */
            float *y = nr == G ? mm_direct_out(c, r0, t0, nt) : NULL;
            c->rk.tile(c->type, pk, c->kn, c->xa + t0 * c->xa_stride, c->xa_stride, nt, y ? y : out);
            if (!y) mm_store(c, r0, nr, t0, nt, out);
        }
    }
}

void cb_mm_rows(const cb_mm_ctx *c, int64_t r0, int64_t r1, int thread) {
    if (c->rp)
        mm_rows_rp(c, r0, r1, thread);
    else
        mm_rows_direct(c, r0, r1);
}

/* cb_matmul_ex's two phases: its activation rows prepared (gathered through token_ids), then
 * tasks of rows_per_task output rows. */
typedef struct {
    cb_mm_ctx mm;
    const float *x;
    int64_t x_stride;
    int64_t tokens_per_task, rows_per_task;
    uint8_t *xa_out;
} mm_job;

static void mm_prep_task(void *vctx, int task, int thread) {
    (void)thread;
    const mm_job *j = vctx;
    const cb_mm_ctx *c = &j->mm;
    int64_t t0 = (int64_t)task * j->tokens_per_task;
    int64_t t1 = t0 + j->tokens_per_task < c->n_tokens ? t0 + j->tokens_per_task : c->n_tokens;
    for (int64_t t = t0; t < t1; t++) {
        int64_t src = c->token_ids ? c->token_ids[t] : t;
        cb_mm_prep_row(c, j->x + src * j->x_stride, j->xa_out + t * c->xa_stride);
    }
}

static void mm_task(void *vctx, int task, int thread) {
    const mm_job *j = vctx;
    int64_t r_begin = (int64_t)task * j->rows_per_task;
    int64_t r_end = r_begin + j->rows_per_task < j->mm.rows ? r_begin + j->rows_per_task
                                                            : j->mm.rows;
    cb_mm_rows(&j->mm, r_begin, r_end, thread);
}

cb_matmul_opts_t cb_matmul_default_opts(void) {
    cb_matmul_opts_t o;
    memset(&o, 0, sizeof o);
    return o;
}

cb_status cb_matmul(const cb_matrix_t *w, const float *x, int64_t n_tokens, int64_t x_stride,
                    float *y, int64_t y_stride, cb_threadpool_t *pool) {
    return cb_matmul_ex(w, x, n_tokens, x_stride, y, y_stride, NULL, pool);
}

cb_status cb_matmul_ex(const cb_matrix_t *w, const float *x, int64_t n_tokens, int64_t x_stride,
                       float *y, int64_t y_stride, const cb_matmul_opts_t *opts,
                       cb_threadpool_t *pool) {
    cb_status s = cb_matrix_check(w);
    if (s != CB_OK) return s;
    cb_matmul_opts_t o = opts ? *opts : cb_matmul_default_opts();
    if (n_tokens < 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matmul: n_tokens %lld < 0",
                       (long long)n_tokens);
    if (n_tokens == 0 || w->rows == 0) return CB_OK;
    if (!x || !y) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matmul: x or y is NULL");
    if (x_stride < w->cols || y_stride < w->rows)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "matmul: x_stride %lld < cols %lld or y_stride %lld < rows %lld",
                       (long long)x_stride, (long long)w->cols, (long long)y_stride,
                       (long long)w->rows);
    if (n_tokens > INT32_MAX / 2)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "matmul: %lld tokens is too many",
                       (long long)n_tokens);
    if (o.token_ids) {
        for (int64_t t = 0; t < n_tokens; t++)
            if (o.token_ids[t] < 0 || o.token_ids[t] >= o.n_rows_xy)
                return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                               "matmul: token id %d at %lld not in [0, %lld)",
                               (int)o.token_ids[t], (long long)t, (long long)o.n_rows_xy);
    }

    mm_job j;
    memset(&j, 0, sizeof j);
    cb_mm_ctx *c = &j.mm;
    cb_mm_plan(c, w, o.fast, cb_mm_packed(w->type, n_tokens, o.packed));
    c->n_tokens = n_tokens;
    c->y = y;
    c->y_stride = y_stride;
    c->accumulate = o.accumulate;
    c->token_scale = o.token_scale;
    c->token_ids = o.token_ids;
    j.x = x;
    j.x_stride = x_stride;
    /* float weights read x in place unless gathered; the others read prepared rows */
    c->xa_stride = c->act_stride;
    size_t need = act_for(w->type) != CB_ACT_F32 || o.token_ids ? c->xa_stride * (size_t)n_tokens
                                                                : 0;
    if (need > 0 && need / (size_t)n_tokens != c->xa_stride)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "matmul: activation buffer size overflows");

    int n_threads = cb_threadpool_n_threads(pool);
    size_t act_need = (need + 63) / 64 * 64; /* the packing buffers start 64-byte aligned */
    if (act_need < need) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "matmul: buffer size overflows");
    if (c->rp && !c->prepacked) {
        size_t extra = c->pack_stride * (size_t)n_threads;
        if (c->pack_stride == 0 || extra / (size_t)n_threads != c->pack_stride ||
            act_need > SIZE_MAX - extra)
            return cb_fail(CB_STATUS_OUT_OF_MEMORY, "matmul: packing buffer size overflows");
        need = act_need + extra;
    }
    s = cb_threadpool_lock(pool);
    if (s != CB_OK) return s;
    void *owned = NULL, *buf = NULL;
    if (need > 0) {
        if (pool) {
            s = cb_threadpool_scratch(pool, need, &buf);
        } else if (cb_posix_memalign(&owned, 64, need) != 0) {
            s = cb_fail(CB_STATUS_OUT_OF_MEMORY, "matmul: no memory for %zu activation bytes",
                        need);
        } else {
            buf = owned;
        }
    }
    if (s == CB_OK && act_need > 0) {
        j.xa_out = buf;
        if (c->rp && !c->prepacked) c->pack = (uint8_t *)buf + act_need;
        j.tokens_per_task = (n_tokens + 4 * n_threads - 1) / (4 * n_threads);
        if (j.tokens_per_task < 1) j.tokens_per_task = 1;
        int n_tasks = (int)((n_tokens + j.tokens_per_task - 1) / j.tokens_per_task);
        s = cb_threadpool_run_locked(pool, mm_prep_task, &j, n_tasks);
        c->xa = buf;
    } else if (s == CB_OK) {
        c->xa = (const uint8_t *)x;
        c->xa_stride = (size_t)x_stride * 4;
    }
    if (s == CB_OK) {
        /* Rows per task: a multiple of the tile height; enough tasks to balance threads, few
         * enough that a task's weight rows are reused across all tokens while in cache. */
        int64_t rpt = w->rows / ((int64_t)n_threads * MM_TASKS_PER_THREAD);
        rpt = rpt < 4 ? 4 : rpt;
        rpt = (rpt + CB_TILE_R1 - 1) / CB_TILE_R1 * CB_TILE_R1; /* whole tiles (R1: 4 | 8) */
        if (c->rp) rpt = (rpt + c->rk.rows - 1) / c->rk.rows * c->rk.rows;
        j.rows_per_task = rpt;
        int64_t n_tasks = (w->rows + rpt - 1) / rpt;
        if (n_tasks > INT32_MAX) {
            s = cb_fail(CB_STATUS_INVALID_ARGUMENT, "matmul: %lld rows is too many",
                        (long long)w->rows);
        } else {
            s = cb_threadpool_run_locked(pool, mm_task, &j, (int)n_tasks);
        }
    }
    cb_threadpool_unlock(pool);
    free(owned);
    return s;
}
