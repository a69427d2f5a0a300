/* The R16 layouts (include/colibri/quant.h): Q8_0 and Q5_0 rows re-laid at load in groups of 16
 * for the decode matvec, in the bytes of the source type.
 *
 * A direct tile must reduce each row's block sum across a vector before scaling it; with 16 rows
 * in each vector (the layout of the VNNI packed-row tiles, rpv16_tile) a block of 16 rows is 8
 * vpdpbusd against broadcast activation words and one fma, with no reduction and no packing per
 * call: the AVX512-VNNI tile (r16_tile, quant_avx512.c) reads the matrix in place at any token
 * count. Its integer block sums and float operations are those of the source type's batch-
 * invariant tiles, so a packed matrix gives the source matrix's products bit for bit. Here: the
 * packing, row lookup, and the scalar tile and activations that run a layout on CPUs without
 * VNNI (colibri packs only where VNNI is; the C API takes the layouts anywhere). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "quant_impl.h"
#include "quant_r16.h"

#define R16_ROWS 16

int cb_r16_layout(int type) {
    return type == CB_TYPE_Q8_0 ? CB_TYPE_Q8_0_R16 : (type == CB_TYPE_Q5_0 ? CB_TYPE_Q5_0_R16 : 0);
}

/* the source type of a layout (0: not a layout) */
static int r16_source(int layout) {
    return layout == CB_TYPE_Q8_0_R16 ? CB_TYPE_Q8_0
                                      : (layout == CB_TYPE_Q5_0_R16 ? CB_TYPE_Q5_0 : 0);
}

/* bytes of one block of a group: 16 of the source type's blocks */
static size_t r16_bstride(int layout) { return layout == CB_TYPE_Q8_0_R16 ? 544 : 352; }

size_t cb_r16_bytes(int layout, int64_t rows, int64_t cols) {
    if (!r16_source(layout) || rows < 0 || cols < 0 || cols % CB_QK) return 0;
    uint64_t groups = ((uint64_t)rows + R16_ROWS - 1) / R16_ROWS;
    uint64_t per = (uint64_t)(cols / CB_QK) * r16_bstride(layout);
    if (per != 0 && groups > SIZE_MAX / per) return 0;
    return (size_t)(groups * per);
}

size_t cb_r16_act_stride(int64_t cols) {
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

static void pack_group(int layout, const uint8_t *w, size_t ws, int nr, int64_t cols,
                       uint8_t *dst) {
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
    const size_t gb = (size_t)(m->cols / CB_QK) * r16_bstride(j->layout);
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
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "pack_r16: %s has no R16 layout (Q8_0 and "
                       "Q5_0 do)", cb_type_name(src->type));
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
    if (layout == CB_TYPE_Q8_0_R16) return o[64 * s + p];
    int v = (o[64 * (s % 4) + p] >> (s >= 4 ? 4 : 0)) & 0x0F;
    return v | ((o[256 + 8 * s + p / 8] >> (p % 8)) & 1) << 4;
}

void cb_r16_get_row(const cb_matrix_t *w, int64_t r, float *out) {
    const int layout = w->type;
    const int64_t nb = w->cols / CB_QK;
    const size_t bst = r16_bstride(layout);
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / R16_ROWS) * R16_ROWS * w->row_bytes;
    const int j = (int)(r % R16_ROWS), zero = layout == CB_TYPE_Q8_0_R16 ? 128 : 16;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * bst;
        const float d = cb_f16_to_f32(cb_rd16(o + bst - 32 + 2 * j));
        for (int k = 0; k < CB_QK; k++)
            out[b * CB_QK + k] = d * (float)(r16_value(layout, o, j, k) - zero);
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

static size_t r16_group_bytes(int layout, int64_t cols) {
    return (size_t)(cols / CB_QK) * r16_bstride(layout);
}

int cb_r16_source(int layout) { return r16_source(layout); }

cb_rp_kernel_t cb_r16_kernel(int simd_level) {
    cb_rp_kernel_t k = {R16_ROWS, CB_RP_MAX_TOKENS, r16_group_bytes, NULL,
                        simd_level >= CB_SIMD_AVX512_VNNI ? cb_avx512_r16_tile_vnni
                                                          : r16_tile_scalar};
    return k;
}
