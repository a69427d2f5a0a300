/* The R16 layouts (include/colibri/quant.h): Q8_0, Q5_0, Q6_K and Q4_K rows re-laid at load in
 * groups of 16 for the decode matvec, in the bytes of the source type.
 *
 * A direct tile must reduce each row's block sum across a vector before scaling it; with 16 rows
 * in each vector (the layout of the VNNI packed-row tiles, rpv16_tile) a block of 16 rows is 8
 * vpdpbusd against broadcast activation words and one fma, with no reduction and no packing per
 * call: the AVX512-VNNI tiles (r16_tile, quant_avx512.c; r16k_tile and r16k4_tile for Q6_K and
 * Q4_K, quant_avx512_k.c) read the matrix in place at any token count. Their integer block sums
 * and float operations are those of the source type's batch-invariant tiles, so a packed matrix
 * gives the source matrix's products bit for bit. Here: the
 * packing, row lookup, and the scalar tile and activations that run a layout on CPUs without
 * VNNI (colibri packs only where VNNI is; the C API takes the layouts anywhere). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "matmul_impl.h"
#include "quant_impl.h"
#include "quant_r16.h"

#define R16_ROWS 16

int cb_r16_layout(int type) {
    switch (type) {
    case CB_TYPE_Q8_0: return CB_TYPE_Q8_0_R16;
    case CB_TYPE_Q5_0: return CB_TYPE_Q5_0_R16;
    case CB_TYPE_Q6_K: return CB_TYPE_Q6_K_R16;
    case CB_TYPE_Q4_K: return CB_TYPE_Q4_K_R16;
    default: return 0;
    }
}

/* the source type of a layout (0: not a layout) */
static int r16_source(int layout) {
    switch (layout) {
    case CB_TYPE_Q8_0_R16: return CB_TYPE_Q8_0;
    case CB_TYPE_Q5_0_R16: return CB_TYPE_Q5_0;
    case CB_TYPE_Q6_K_R16: return CB_TYPE_Q6_K;
    case CB_TYPE_Q4_K_R16: return CB_TYPE_Q4_K;
    default: return 0;
    }
}

/* values of a block, bytes of one block of a group (16 of the source type's blocks) */
static int64_t r16_qk(int layout) {
    return layout == CB_TYPE_Q6_K_R16 || layout == CB_TYPE_Q4_K_R16 ? CB_QKK : CB_QK;
}
static size_t r16_bstride(int layout) {
    switch (layout) {
    case CB_TYPE_Q8_0_R16: return 544;
    case CB_TYPE_Q5_0_R16: return 352;
    case CB_TYPE_Q4_K_R16: return 2304;
    default: return 3360;
    }
}

size_t cb_r16_bytes(int layout, int64_t rows, int64_t cols) {
    if (!r16_source(layout) || rows < 0 || cols < 0 || cols % r16_qk(layout)) return 0;
    uint64_t groups = ((uint64_t)rows + R16_ROWS - 1) / R16_ROWS;
    uint64_t per = (uint64_t)(cols / r16_qk(layout)) * r16_bstride(layout);
    if (per != 0 && groups > SIZE_MAX / per) return 0;
    return (size_t)(groups * per);
}

size_t cb_r16_act_stride(int layout, int64_t cols) {
    if (layout != CB_TYPE_Q8_0_R16 && layout != CB_TYPE_Q5_0_R16) return 0;
    size_t b = (size_t)cols + 12 * (size_t)(cols / CB_QK);
    return (b + 63) / 64 * 64;
}

/* Position of value k (< 32) of row j (< 16) in a block's steps: step k / 4, byte 32 * (j / 8) +
 * 4 * (j % 8) + k % 4 of the step's 64. */
static inline int r16_pos(int j, int k) { return 32 * (j / 8) + 4 * (j % 8) + k % 4; }

/* value k of row j's source block (Q8_0: q + 128, Q5_0: q, both 0..255 / 0..31) and its d */
static inline int src_value(int layout, const uint8_t *blk, int k) {
    if (layout == CB_TYPE_Q8_0_R16) return (int)(uint8_t)(blk[2 + k] ^ 0x80);
    uint32_t qh = cb_rd32(blk + 2);
    int lo = k < 16 ? blk[6 + k] & 0x0F : blk[6 + k - 16] >> 4;
    return lo | (int)((qh >> k) & 1u) << 4;
}

/* Offsets in a Q6_K group's super-block (3360 bytes) of the 64 positions of step s (< 64): its
 * low nibbles (in the high half of each byte when s >= 32) and high bits (at bit 2 * (s / 16)).
 * 16 chunks of 192 bytes, chunk k = [steps k | k + 32] [steps k + 16 | k + 48] [high bits of
 * steps k + 16f], then the scales [sub-block][row] and d[16]. */
static inline size_t q6r_lo(int s) { return 192 * (size_t)(s % 16) + 64 * (size_t)((s / 16) & 1); }
static inline size_t q6r_hi(int s) { return 192 * (size_t)(s % 16) + 128; }

/* A Q6_K group's super-block (padding rows: zeros, d = 0) */
static void pack_q6k_block(const uint8_t *w, size_t ws, int nr, int64_t b, uint8_t *o) {
    memset(o, 0, 3360);
    for (int j = 0; j < nr; j++) {
        const uint8_t *blk = w + (size_t)j * ws + (size_t)b * 210;
        memcpy(o + 3328 + 2 * j, blk + 208, 2);
        for (int g = 0; g < 16; g++) o[3072 + 16 * g + j] = blk[192 + g];
        for (int k = 0; k < CB_QKK; k++) {
            const int s = k / 4, p = 4 * j + k % 4, v = cb_q6k_value(blk, blk + 128, k) + 32;
            o[q6r_lo(s) + p] |= (uint8_t)((v & 0x0F) << (s >= 32 ? 4 : 0));
            o[q6r_hi(s) + p] |= (uint8_t)((v >> 4) << (2 * (s / 16)));
        }
    }
}

/* A Q4_K group's super-block (2304 bytes): 32 vectors, vector 8j + i the low nibbles of step
 * 8j + i (sub-block j) | those of step 8j + i + 32 (sub-block j + 4) << 4; 128 bytes [sub-block
 * j][row]: scale | (min & 3) << 6; 64 bytes [j < 4][row]: min_j >> 2 | (min_j+4 >> 2) << 4;
 * d[16], dmin[16] (padding rows: zeros). */
static void pack_q4k_block(const uint8_t *w, size_t ws, int nr, int64_t b, uint8_t *o) {
    memset(o, 0, 2304);
    for (int j = 0; j < nr; j++) {
        const uint8_t *blk = w + (size_t)j * ws + (size_t)b * 144;
        memcpy(o + 2240 + 2 * j, blk, 2);
        memcpy(o + 2272 + 2 * j, blk + 2, 2);
        for (int g = 0; g < 8; g++) {
            uint8_t sc, m;
            cb_scale_min_k4(g, blk + 4, &sc, &m);
            o[2048 + 16 * g + j] = (uint8_t)(sc | (m & 3) << 6);
            o[2176 + 16 * (g % 4) + j] |= (uint8_t)((m >> 2) << (g >= 4 ? 4 : 0));
        }
        for (int k = 0; k < CB_QKK; k++) {
            const int s = k / 4, p = 4 * j + k % 4;
            const int v = blk[16 + 32 * (k / 64) + k % 32] >> (k % 64 >= 32 ? 4 : 0) & 0x0F;
            o[64 * (s % 32) + p] |= (uint8_t)(v << (s >= 32 ? 4 : 0));
        }
    }
}

static void pack_group(int layout, const uint8_t *w, size_t ws, int nr, int64_t cols,
                       uint8_t *dst) {
    if (layout == CB_TYPE_Q6_K_R16 || layout == CB_TYPE_Q4_K_R16) {
        void (*pack)(const uint8_t *, size_t, int, int64_t, uint8_t *) =
            layout == CB_TYPE_Q6_K_R16 ? pack_q6k_block : pack_q4k_block;
        const size_t bst = r16_bstride(layout);
        for (int64_t b = 0; b < cols / CB_QKK; b++) pack(w, ws, nr, b, dst + (size_t)b * bst);
        return;
    }
    const int64_t nb = cols / CB_QK;
    const size_t bst = r16_bstride(layout), sbytes = layout == CB_TYPE_Q8_0_R16 ? 34 : 22;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * bst;
        memset(o, 0, bst);
        for (int j = 0; j < R16_ROWS; j++) {
            const uint8_t *blk = j < nr ? w + (size_t)j * ws + (size_t)b * sbytes : NULL;
            memcpy(o + bst - 32 + 2 * j, blk ? blk : (const uint8_t *)"\0\0", 2); /* d (f16) */
            uint8_t v[CB_QK]; /* a padding row: q = 0 (Q8_0: the byte 128) and d = 0 */
            for (int k = 0; k < CB_QK; k++)
                v[k] = (uint8_t)(blk ? src_value(layout, blk, k) : (layout == CB_TYPE_Q8_0_R16 ? 128 : 0));
            for (int s = 0; s < 8; s++) { /* value 4s + i at position r16_pos(j, 4s) + i */
                const int p = r16_pos(j, 4 * s);
                if (layout == CB_TYPE_Q8_0_R16) {
                    memcpy(o + 64 * s + p, v + 4 * s, 4);
                    continue;
                }
                for (int i = 0; i < 4; i++) {
                    o[64 * (s % 4) + p + i] |= (uint8_t)((v[4 * s + i] & 0x0F) << (s >= 4 ? 4 : 0));
                    o[256 + 8 * s + (p + i) / 8] |= (uint8_t)((v[4 * s + i] >> 4) << ((p + i) % 8));
                }
            }
        }
    }
}

typedef struct {
    const cb_matrix_t *src;
    uint8_t *dst;
    int layout;
    int64_t groups, per_task;
} pack_job;

static void pack_task(void *vctx, int task, int thread) {
    (void)thread;
    const pack_job *j = vctx;
    const cb_matrix_t *m = j->src;
    const size_t gb = (size_t)(m->cols / r16_qk(j->layout)) * r16_bstride(j->layout);
    int64_t g1 = (int64_t)(task + 1) * j->per_task;
    if (g1 > j->groups) g1 = j->groups;
    for (int64_t g = (int64_t)task * j->per_task; g < g1; g++) {
        const uint8_t *w = (const uint8_t *)m->data + (size_t)g * R16_ROWS * m->row_bytes;
        int nr = m->rows - g * R16_ROWS < R16_ROWS ? (int)(m->rows - g * R16_ROWS) : R16_ROWS;
        pack_group(j->layout, w, m->row_bytes, nr, m->cols, j->dst + (size_t)g * gb);
    }
}

cb_status cb_pack_r16(const cb_matrix_t *src, void *dst, size_t dst_bytes, cb_threadpool_t *pool) {
    cb_status s = cb_matrix_check(src);
    if (s != CB_OK) return s;
    const int layout = cb_r16_layout(src->type);
    if (!layout)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "pack_r16: %s has no R16 layout (Q8_0, Q5_0, "
                       "Q6_K and Q4_K do)", cb_type_name(src->type));
    size_t need = cb_r16_bytes(layout, src->rows, src->cols);
    if (need == 0 && src->rows > 0 && src->cols > 0)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "pack_r16: %lld x %lld overflows",
                       (long long)src->rows, (long long)src->cols);
    if (dst_bytes < need)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "pack_r16: %zu bytes for a %lld x %lld matrix that needs %zu", dst_bytes,
                       (long long)src->rows, (long long)src->cols, need);
    if (need == 0) return CB_OK;
    if (!dst || (uintptr_t)dst % 64)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "pack_r16: dst %p is not 64-byte aligned", dst);
    pack_job j = {src, dst, layout, ((int64_t)src->rows + R16_ROWS - 1) / R16_ROWS, 0};
    int64_t tasks = 8 * (int64_t)cb_threadpool_n_threads(pool);
    j.per_task = (j.groups + tasks - 1) / tasks;
    return cb_threadpool_run(pool, pack_task, &j, (int)((j.groups + j.per_task - 1) / j.per_task));
}

/* value k of row j from a group's block o (the byte vpdpbusd multiplies) */
static inline int r16_value(int layout, const uint8_t *o, int j, int k) {
    const int s = k / 4, p = r16_pos(j, k);
    if (layout == CB_TYPE_Q6_K_R16)
        return (o[q6r_lo(s) + p] >> (s >= 32 ? 4 : 0) & 0x0F) |
               (o[q6r_hi(s) + p] >> (2 * (s / 16)) & 3) << 4;
    if (layout == CB_TYPE_Q8_0_R16) return o[64 * s + p];
    if (layout == CB_TYPE_Q4_K_R16) return o[64 * (s % 32) + p] >> (s >= 32 ? 4 : 0) & 0x0F;
    int v = (o[64 * (s % 4) + p] >> (s >= 4 ? 4 : 0)) & 0x0F;
    return v | ((o[256 + 8 * s + p / 8] >> (p % 8)) & 1) << 4;
}

/* sub-block g's scale and min of row j in a Q4_K group's super-block o */
static inline void q4kr_scale_min(const uint8_t *o, int g, int j, int *sc, int *m) {
    const uint8_t b = o[2048 + 16 * g + j];
    *sc = b & 63;
    *m = b >> 6 | (o[2176 + 16 * (g % 4) + j] >> (g >= 4 ? 4 : 0) & 0x0F) << 2;
}

/* Row j of a Q4_K group as ggml dequantizes it: d * sc * q - dmin * m. */
static void q4kr_get_row(const uint8_t *g, int64_t nb, int j, float *out) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * 2304;
        const float d = cb_f16_to_f32(cb_rd16(o + 2240 + 2 * j));
        const float dmin = cb_f16_to_f32(cb_rd16(o + 2272 + 2 * j));
        for (int k = 0; k < CB_QKK; k++) {
            int sc, m;
            q4kr_scale_min(o, k / 32, j, &sc, &m);
            out[b * CB_QKK + k] = d * (float)sc * (float)r16_value(CB_TYPE_Q4_K_R16, o, j, k) -
                                  dmin * (float)m;
        }
    }
}

void cb_r16_get_row(const cb_matrix_t *w, int64_t r, float *out) {
    const int layout = w->type;
    if (layout == CB_TYPE_Q4_K_R16) {
        q4kr_get_row((const uint8_t *)w->data + (size_t)(r / R16_ROWS) * R16_ROWS * w->row_bytes,
                     w->cols / CB_QKK, (int)(r % R16_ROWS), out);
        return;
    }
    const int64_t qk = r16_qk(layout), nb = w->cols / qk;
    const size_t bst = r16_bstride(layout);
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / R16_ROWS) * R16_ROWS * w->row_bytes;
    const int j = (int)(r % R16_ROWS);
    const int zero = layout == CB_TYPE_Q8_0_R16 ? 128 : (layout == CB_TYPE_Q5_0_R16 ? 16 : 32);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * bst;
        const float d = cb_f16_to_f32(cb_rd16(o + bst - 32 + 2 * j));
        for (int k = 0; k < qk; k++) { /* Q6_K: d * scale, as ggml's dequantizer */
            const float dk =
                layout == CB_TYPE_Q6_K_R16 ? d * (float)(int8_t)o[3072 + 16 * (k / 16) + j] : d;
            out[b * qk + k] = dk * (float)(r16_value(layout, o, j, k) - zero);
        }
    }
}

/* The packed-row activations (cb_avx2_rp_quantize's bytes) from the scalar quantizer: qs[cols],
 * then d[nb], z*isum[nb] (z: the source type's zero point), d*isum[nb]. */
void cb_r16_quantize_scalar(int type, const float *x, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    const int z = cb_rp_act_z(type);
    float *dx = (float *)(void *)(dst + cols);
    int32_t *zi = (int32_t *)(void *)(dx + nb);
    float *sx = (float *)(void *)(zi + nb);
    for (int64_t b = 0; b < nb; b++) {
        cb_q8a_t a;
        cb_scalar_quantize_q8a(x + b * CB_QK, CB_QK, &a);
        memcpy(dst + b * CB_QK, a.qs, CB_QK);
        dx[b] = a.d;
        zi[b] = z * a.isum;
        sx[b] = a.s;
    }
}

/* A group against nt <= 8 tokens as r16_tile computes it: per row and block the exact integer
 * sum(q' * x) - z * isum, then acc = fma(isum, d * d_x, acc) in block order. out[r * nt + t]. */
static void r16_tile_scalar(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                            size_t xs, int nt, float *out) {
    const int64_t cols = nb * CB_QK;
    const size_t bst = r16_bstride(layout);
    for (int t = 0; t < nt; t++) {
        const uint8_t *xq = xa + (size_t)t * xs;
        const float *dx = (const float *)(const void *)(xq + cols);
        const int32_t *zi = (const int32_t *)(const void *)(dx + nb);
        for (int j = 0; j < R16_ROWS; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = pk + (size_t)b * bst;
                int32_t isum = 0;
                for (int k = 0; k < CB_QK; k++)
                    isum += r16_value(layout, o, j, k) * (int32_t)(int8_t)xq[b * CB_QK + k];
                const float d = cb_f16_to_f32(cb_rd16(o + bst - 32 + 2 * j));
                acc = fmaf((float)(isum - zi[b]), d * dx[b], acc);
            }
            out[j * nt + t] = acc;
        }
    }
}

/* A Q6_K group against nt <= 4 tokens (cb_q8k_t rows) as r16k_tile computes it: per row and
 * super-block the exact integer sum over sub-blocks of sc * (sum(q * x) - 32 * bsum), then
 * acc = fma(isum, d * d_x, acc) in super-block order (the Q6_K tiles' floats). */
static void r16k_tile_scalar(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                             size_t xs, int nt, float *out) {
    for (int t = 0; t < nt; t++) {
        for (int j = 0; j < R16_ROWS; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = pk + (size_t)b * 3360;
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
                int32_t isum = 0;
                for (int g = 0; g < 16; g++) {
                    int32_t s = -32 * a->bsums[g];
                    for (int k = 16 * g; k < 16 * g + 16; k++)
                        s += r16_value(layout, o, j, k) * (int32_t)a->qs[k];
                    isum += s * (int32_t)(int8_t)o[3072 + 16 * g + j];
                }
                acc = fmaf((float)isum, cb_f16_to_f32(cb_rd16(o + 3328 + 2 * j)) * a->d, acc);
            }
            out[j * nt + t] = acc;
        }
    }
}

/* A Q4_K group against nt <= 4 tokens as r16k4_tile computes it: per row and super-block the
 * exact sums isum = sum_j sc_j * sum(q * x) and mins = sum_j m_j * (bsums 2j + 2j+1), then
 * acc = fma(isum, d * d_x, acc), acc = fnmadd(mins, dmin * d_x, acc) (the Q4_K tiles' floats). */
static void r16k4_tile_scalar(int layout, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                              size_t xs, int nt, float *out) {
    for (int t = 0; t < nt; t++) {
        for (int j = 0; j < R16_ROWS; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = pk + (size_t)b * 2304;
                const cb_q8k_t *a = (const cb_q8k_t *)(const void *)(xa + (size_t)t * xs) + b;
                int32_t isum = 0, mins = 0;
                for (int g = 0; g < 8; g++) {
                    int sc, m;
                    q4kr_scale_min(o, g, j, &sc, &m);
                    int32_t s = 0;
                    for (int k = 32 * g; k < 32 * g + 32; k++)
                        s += r16_value(layout, o, j, k) * (int32_t)a->qs[k];
                    isum += s * sc;
                    mins += m * (a->bsums[2 * g] + a->bsums[2 * g + 1]);
                }
                const float dx = a->d;
                acc = fmaf((float)isum, cb_f16_to_f32(cb_rd16(o + 2240 + 2 * j)) * dx, acc);
                acc = fmaf(-(float)mins, cb_f16_to_f32(cb_rd16(o + 2272 + 2 * j)) * dx, acc);
            }
            out[j * nt + t] = acc;
        }
    }
}

static size_t r16_group_bytes(int layout, int64_t cols) {
    return (size_t)(cols / r16_qk(layout)) * r16_bstride(layout);
}

int cb_r16_source(int layout) { return r16_source(layout); }

cb_rp_kernel_t cb_r16_kernel(int layout, int simd_level) {
    const int vnni = simd_level >= CB_SIMD_AVX512_VNNI;
    if (layout == CB_TYPE_Q6_K_R16 || layout == CB_TYPE_Q4_K_R16) {
        cb_rp_kernel_t k = {R16_ROWS, 4, r16_group_bytes, NULL, cb_avx512_r16_tile_vnni};
        if (!vnni) k.tile = layout == CB_TYPE_Q6_K_R16 ? r16k_tile_scalar : r16k4_tile_scalar;
        return k;
    }
    cb_rp_kernel_t k = {R16_ROWS, CB_RP_MAX_TOKENS, r16_group_bytes, NULL,
                        vnni ? cb_avx512_r16_tile_vnni : r16_tile_scalar};
    return k;
}

void cb_r16_plan(cb_mm_ctx *c, const cb_matrix_t *w, int level) {
    c->rk = cb_r16_kernel(w->type, level);
    c->rp = c->prepacked = 1;
    c->w_group = (size_t)c->rk.rows * w->row_bytes;
    c->avx512 = level >= CB_SIMD_AVX512;
    if (r16_qk(w->type) == CB_QKK) { /* the K-quants' activations, cb_q8k_t rows */
        c->kn = w->cols / CB_QKK;
        c->act_stride = (size_t)c->kn * sizeof(cb_q8k_t);
        c->act = c->avx512 ? cb_avx512_quantize_q8k
                 : (level >= CB_SIMD_AVX2 ? cb_avx2_quantize_q8k : cb_scalar_quantize_q8k);
        return;
    }
    c->kn = w->cols / CB_QK;
    c->act_stride = cb_r16_act_stride(w->type, w->cols);
    c->rpq = c->avx512 ? cb_avx512_rp_quantize
             : level >= CB_SIMD_AVX2 ? cb_avx2_rp_quantize : cb_r16_quantize_scalar;
}
