/* The R16 layouts' private pieces (quant_r16.c) for the matmul drivers (quant.c). */
#ifndef COLIBRI_QUANT_R16_H
#define COLIBRI_QUANT_R16_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/quant.h"
#include "matmul_impl.h"
#include "quant_impl.h"

/* Bytes of one prepared activation row (the packed-row planar layout) of cols values for a
 * Q8_0 / Q5_0 layout; 0 for any other type (the K layouts read cb_q8k_t rows). */
size_t cb_r16_act_stride(int layout, int64_t cols);
/* That layout from the scalar quantizer (for CPUs without AVX2). */
void cb_r16_quantize_scalar(int type, const float *x, int64_t cols, uint8_t *dst);
/* Row r of an R16 matrix (checked by the caller), dequantized to w->cols floats. */
void cb_r16_get_row(const cb_matrix_t *w, int64_t r, float *out);
/* The source type of a layout (Q8_0 / Q5_0 / Q6_K / Q4_K), 0 for any other type. */
int cb_r16_source(int layout);
/* The kernel reading a layout's groups in place at a SIMD level (its tile takes the layout as
 * its type; activations: the packed-row planar rows, cb_q8k_t rows for the K layouts): the
 * AVX512-VNNI tile, else a scalar one with the same results (pack is unused). */
cb_rp_kernel_t cb_r16_kernel(int layout, int simd_level);
/* cb_mm_plan for a matrix in an R16 layout at a SIMD level: the packed-row path on the matrix's
 * own groups (prepacked, no pack), at every token count, with the layout's activations. */
void cb_r16_plan(cb_mm_ctx *c, const cb_matrix_t *w, int level);

#endif
