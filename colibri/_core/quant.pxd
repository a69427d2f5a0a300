from libc.stdint cimport int32_t, int64_t, uint16_t

from colibri._core.status cimport cb_status
from colibri._core.threadpool cimport cb_threadpool_t

cdef extern from "colibri/quant.h" nogil:
    ctypedef struct cb_matrix_t:
        int type
        int64_t rows
        int64_t cols
        size_t row_bytes
        const void *data
    ctypedef struct cb_matmul_opts_t:
        int accumulate
        const float *token_scale
        const int32_t *token_ids
        int64_t n_rows_xy
        int packed
        int fast
    int64_t cb_type_block_size(int type)
    size_t cb_type_block_bytes(int type)
    cb_status cb_type_row_bytes(int type, int64_t n, size_t *out)
    const char *cb_type_name(int type)
    int cb_type_supported(int type)
    cb_status cb_matrix_check(const cb_matrix_t *w)
    cb_status cb_dequantize_rows(int type, const void *src, int64_t n_values, float *dst)
    cb_status cb_get_rows(const cb_matrix_t *w, const int32_t *ids, int64_t n, float *out)
    cb_status cb_matmul(const cb_matrix_t *w, const float *x, int64_t n_tokens, int64_t x_stride,
                        float *y, int64_t y_stride, cb_threadpool_t *pool)
    cb_matmul_opts_t cb_matmul_default_opts()
    cb_status cb_matmul_ex(const cb_matrix_t *w, const float *x, int64_t n_tokens,
                           int64_t x_stride, float *y, int64_t y_stride,
                           const cb_matmul_opts_t *opts, cb_threadpool_t *pool)
    cb_status cb_quantize_q8_0(const float *x, int64_t n, void *dst)
    cb_status cb_quantize_i4g128(const float *src, int64_t n, void *dst)
    int cb_r16_layout(int type)
    size_t cb_r16_bytes(int layout, int64_t rows, int64_t cols)
    cb_status cb_pack_r16(const cb_matrix_t *src, void *dst, size_t dst_bytes, cb_threadpool_t *pool)
    float cb_f16_to_f32(uint16_t h)
    uint16_t cb_f32_to_f16(float f)
