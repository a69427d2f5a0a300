/* The matmul drivers' shared pieces (quant.c: cb_matmul_ex; moe.c: the routed experts of a MoE
 * layer in a fixed number of dispatches). One cb_mm_ctx describes one weight matrix against a
 * run of prepared activation rows; the kernel choice (direct tiles or packed rows, SIMD level,
 * batch invariance) is made once by cb_mm_plan, so every caller computes a row the same way
 * and gets the same bits for it. */
#ifndef COLIBRI_MATMUL_IMPL_H
#define COLIBRI_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "quant_impl.h"

typedef struct cb_mm_ctx {
    /* the weights */
    const uint8_t *w;
    size_t w_stride;
    int64_t rows, cols;
    int type;
    /* kernels (cb_mm_plan) */
    cb_tile_fn tile;   /* direct tiles; NULL: the scalar dot below */
    cb_dot_fn dot;
    int64_t kn;        /* the n of the tile / dot functions */
    cb_act_fn act;     /* activation quantizer; NULL: rp quantizer (rp) or a float copy */
    int rp;            /* packed rows (rk's pack and tile) */
    int prepacked;     /* rp on a matrix stored packed (an R16 layout): no pack, group g at
                        * w + g * w_group */
    size_t w_group;
    void (*rpq)(int type, const float *x, int64_t cols, uint8_t *dst); /* rp: activations */
    int avx512;        /* rp: the AVX-512 activation quantizer */
    cb_rp_kernel_t rk; /* the type's packed-row kernels at this level (cb_rp_kernel) */
    size_t act_stride; /* bytes of one prepared activation row (cb_mm_prep_row) */
    size_t pack_stride; /* rp: bytes of one thread's group buffer (64-byte multiple) */
    uint8_t *pack;     /* rp: per-thread group buffers, pack_stride bytes apart */
    /* the prepared activations: n_tokens rows, xa_stride bytes apart */
    const uint8_t *xa;
    size_t xa_stride;
    int64_t n_tokens;
    /* the output: row t (token_ids[t] when set) of y, y_stride floats apart:
     * y = out, y = s * out (token_scale), or y += s * out (accumulate) */
    float *y;
    int64_t y_stride;
    int accumulate;
    const float *token_scale;
    const int32_t *token_ids;
} cb_mm_ctx;

/* Whether a call of n_tokens takes the packed-row path (opts.packed: 0 = by token count,
 * > 0 = wherever the type has one, < 0 = never), at the running SIMD level. */
int cb_mm_packed(int type, int64_t n_tokens, int packed);

/* Fills c's weights (w->data may be NULL: set c->w per call) and kernels, for packed rows when
 * rp (and the type and level have them), batch invariant unless fast. c->act_stride and
 * c->pack_stride come out set; the activations, output and pack buffers are the caller's. */
void cb_mm_plan(cb_mm_ctx *c, const cb_matrix_t *w, int fast, int rp);

/* Prepares one activation row (cols floats) as c's kernels read it: quantized, packed-row
 * planar, or copied (float weights). dst: c->act_stride bytes (32-byte aligned for rp). */
void cb_mm_prep_row(const cb_mm_ctx *c, const float *x, uint8_t *dst);

/* Output rows [r0, r1) for every token of c (rp: r0 a multiple of c->rk.rows), on pool thread `thread`
 * (its pack buffer). The one place a matmul's products are computed and stored. */
void cb_mm_rows(const cb_mm_ctx *c, int64_t r0, int64_t r1, int thread);

/* Level-independent bounds for buffers sized once (the SIMD level may be capped later): bytes
 * of a prepared activation row of `type` with cols values on any path, a 64-byte multiple;
 * bytes of one thread's packed-row group buffer (0 when the type has no packed rows). */
size_t cb_mm_act_bound(int type, int64_t cols);
size_t cb_mm_pack_bound(int type, int64_t cols);

#endif
