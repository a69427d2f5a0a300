/* Q8_0_R16 (include/colibri/quant.h): Q8_0 rows re-laid in groups of 16 for the decode matvec.
 *
 * The layout is the 16-row packed-row group of Q8_0 (cb_avx2_rp16_pack, quant_avx2.c), kept for
 * the life of the matrix instead of being rebuilt per call: the AVX512-VNNI packed tile
 * (rpv16_tile, quant_avx512.c) then reads the matrix in place at any token count. Its integer
 * block sums and float operations are those of the Q8_0 batch-invariant tiles, so a packed
 * matrix gives the Q8_0 matrix's products bit for bit. Here: the packing (SIMD where the CPU has
 * it, else the scalar packing below, which writes the same bytes), row lookup, and the scalar
 * tile and activation layout that run the layout on CPUs without VNNI (colibri packs only where
 * VNNI is, but the C API takes the layout anywhere). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "quant_impl.h"
#include "quant_r16.h"

#define R16_ROWS 16
#define R16_BSTRIDE 576 /* per block of a group: 8 steps x 64 bytes, then d[16] as f32 */

size_t cb_q8_0_r16_bytes(int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0 || cols % CB_QK) return 0;
    uint64_t groups = ((uint64_t)rows + R16_ROWS - 1) / R16_ROWS;
    uint64_t per = (uint64_t)(cols / CB_QK) * R16_BSTRIDE;
    if (per != 0 && groups > SIZE_MAX / per) return 0;
    return (size_t)(groups * per);
}

size_t cb_r16_act_stride(int64_t cols) {
    size_t b = (size_t)cols + 12 * (size_t)(cols / CB_QK);
    return (b + 63) / 64 * 64;
}

/* The byte of value k (< 32) of row j (< 16) in a block of a group. */
static inline size_t r16_at(int j, int k) {
    return (size_t)64 * (size_t)(k / 4) + (size_t)32 * (size_t)(j / 8) + (size_t)4 * (size_t)(j % 8) +
           (size_t)(k % 4);
}

static void pack_scalar(const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst) {
    const int64_t nb = cols / CB_QK;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * R16_BSTRIDE;
        float d[R16_ROWS];
        for (int j = 0; j < R16_ROWS; j++) {
            const uint8_t *blk = j < nr ? w + (size_t)j * ws + (size_t)b * 34 : NULL;
            d[j] = blk ? cb_f16_to_f32(cb_rd16(blk)) : 0.0f;
            for (int k = 0; k < CB_QK; k++) o[r16_at(j, k)] = (uint8_t)((blk ? blk[2 + k] : 0) ^ 0x80);
        }
        memcpy(o + 512, d, sizeof d);
    }
}

typedef struct {
    const cb_matrix_t *src;
    uint8_t *dst;
    int64_t groups, per_task;
    int simd;
} pack_job;

static void pack_task(void *vctx, int task, int thread) {
    (void)thread;
    const pack_job *j = vctx;
    const cb_matrix_t *m = j->src;
    const size_t gb = (size_t)(m->cols / CB_QK) * R16_BSTRIDE;
    int64_t g1 = (int64_t)(task + 1) * j->per_task;
    if (g1 > j->groups) g1 = j->groups;
    for (int64_t g = (int64_t)task * j->per_task; g < g1; g++) {
        const uint8_t *w = (const uint8_t *)m->data + (size_t)g * R16_ROWS * m->row_bytes;
        int nr = m->rows - g * R16_ROWS < R16_ROWS ? (int)(m->rows - g * R16_ROWS) : R16_ROWS;
        if (j->simd >= CB_SIMD_AVX512)
            cb_avx512_rp16_pack(CB_TYPE_Q8_0, w, m->row_bytes, nr, m->cols, j->dst + (size_t)g * gb);
        else if (j->simd >= CB_SIMD_AVX2)
            cb_avx2_rp16_pack(CB_TYPE_Q8_0, w, m->row_bytes, nr, m->cols, j->dst + (size_t)g * gb);
        else
            pack_scalar(w, m->row_bytes, nr, m->cols, j->dst + (size_t)g * gb);
    }
}

cb_status cb_pack_q8_0_r16(const cb_matrix_t *src, void *dst, size_t dst_bytes,
                           cb_threadpool_t *pool) {
    cb_status s = cb_matrix_check(src);
    if (s != CB_OK) return s;
    if (src->type != CB_TYPE_Q8_0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "pack_q8_0_r16: the matrix is %s, not Q8_0",
                       cb_type_name(src->type));
    size_t need = cb_q8_0_r16_bytes(src->rows, src->cols);
    if (need == 0 && src->rows > 0 && src->cols > 0)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "pack_q8_0_r16: %lld x %lld overflows",
                       (long long)src->rows, (long long)src->cols);
    if (dst_bytes < need)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "pack_q8_0_r16: %zu bytes for a %lld x %lld matrix that needs %zu",
                       dst_bytes, (long long)src->rows, (long long)src->cols, need);
    if (need == 0) return CB_OK;
    if (!dst || (uintptr_t)dst % 64)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "pack_q8_0_r16: dst %p is not 64-byte aligned", dst);
    pack_job j = {src, dst, ((int64_t)src->rows + R16_ROWS - 1) / R16_ROWS, 0, cb_cpu_level()};
    int64_t tasks = 8 * (int64_t)cb_threadpool_n_threads(pool);
    j.per_task = (j.groups + tasks - 1) / tasks;
    return cb_threadpool_run(pool, pack_task, &j, (int)((j.groups + j.per_task - 1) / j.per_task));
}

void cb_r16_get_row(const cb_matrix_t *w, int64_t r, float *out) {
    const int64_t nb = w->cols / CB_QK;
    const uint8_t *g = (const uint8_t *)w->data + (size_t)(r / R16_ROWS) * R16_ROWS * w->row_bytes;
    const int j = (int)(r % R16_ROWS);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *o = g + (size_t)b * R16_BSTRIDE;
        float d;
        memcpy(&d, o + 512 + 4 * j, 4);
        for (int k = 0; k < CB_QK; k++) out[b * CB_QK + k] = d * (float)(int8_t)(o[r16_at(j, k)] ^ 0x80);
    }
}

/* The packed-row activations (cb_avx2_rp_quantize's bytes) from the scalar quantizer: qs[cols],
 * then d[nb], 128*isum[nb] (Q8_0's z), d*isum[nb]. */
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

/* A group against nt <= 8 tokens, as rpv16_tile computes it: per row and block the exact
 * integer sum((q + 128) * x) - 128 * isum, then acc = fma(isum, d * d_x, acc) in block order.
 * out[r * nt + t]. */
static void r16_tile_scalar(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                            size_t xs, int nt, float *out) {
    (void)type;
    const int64_t cols = nb * CB_QK;
    for (int t = 0; t < nt; t++) {
        const uint8_t *xq = xa + (size_t)t * xs;
        const float *dx = (const float *)(const void *)(xq + cols);
        const int32_t *zi = (const int32_t *)(const void *)(dx + nb);
        for (int j = 0; j < R16_ROWS; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *o = pk + (size_t)b * R16_BSTRIDE;
                int32_t isum = 0;
                for (int k = 0; k < CB_QK; k++)
                    isum += (int32_t)o[r16_at(j, k)] * (int32_t)(int8_t)xq[b * CB_QK + k];
                float d;
                memcpy(&d, o + 512 + 4 * j, 4);
                acc = fmaf((float)(isum - zi[b]), d * dx[b], acc);
            }
            out[j * nt + t] = acc;
        }
    }
}

static size_t r16_group_bytes(int type, int64_t cols) {
    (void)type;
    return (size_t)(cols / CB_QK) * R16_BSTRIDE;
}

cb_rp_kernel_t cb_r16_kernel(int simd_level) {
    if (simd_level >= CB_SIMD_AVX512_VNNI) return cb_rp_kernel(CB_TYPE_Q8_0, simd_level);
    cb_rp_kernel_t k = {R16_ROWS, CB_RP_MAX_TOKENS, r16_group_bytes, NULL, r16_tile_scalar};
    return k;
}
