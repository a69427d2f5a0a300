/* Q8_0_R16 in C (under ASan/UBSan): the packing writes the same bytes at every SIMD level (the
 * scalar packing against the SIMD ones), every row read back equals the Q8_0 row, and matmul on
 * the layout equals matmul on the Q8_0 matrix bit for bit (1-9 tokens, 1 and 2 threads, a
 * partial last group) at every level from AVX2 up; the scalar tile equals the AVX2 level's
 * products. Bad arguments are refused. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "testutil.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void *aligned(size_t n) {
    void *p = NULL;
    return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}

/* rows x cols Q8_0 with random values and finite scales of both signs (incl. subnormal) */
static uint8_t *random_q8_0(int rows, int cols) {
    size_t rb = (size_t)cols / 32 * 34;
    uint8_t *w = aligned(rb * (size_t)rows);
    for (size_t b = 0; b < rb * (size_t)rows / 34; b++) {
        uint8_t *blk = w + 34 * b;
        uint16_t d = (uint16_t)(rnd() % 7 == 0 ? rnd() % 0x400 : 0x2000 + rnd() % 0x1800);
        d |= (uint16_t)(rnd() & 1) << 15;
        memcpy(blk, &d, 2);
        for (int k = 0; k < 32; k++) blk[2 + k] = (uint8_t)rnd();
    }
    return w;
}

static void check_shape(int rows, int cols, cb_threadpool_t *pool) {
    size_t rb = (size_t)cols / 32 * 34, need = cb_q8_0_r16_bytes(rows, cols);
    CHECK(need == (size_t)((rows + 15) / 16) * (size_t)(cols / 32) * 576);
    uint8_t *w = random_q8_0(rows, cols), *pk = aligned(need), *pk0 = aligned(need);
    cb_matrix_t q = {CB_TYPE_Q8_0, rows, cols, rb, w};
    cb_matrix_t r = {CB_TYPE_Q8_0_R16, rows, cols, (size_t)cols / 32 * 36, pk};
    cb_simd_level top = cb_cpu_detect();
    cb_simd_level prev = cb_cpu_set_max_level(CB_SIMD_SCALAR);
    CHECK(cb_pack_q8_0_r16(&q, pk0, need, NULL) == CB_OK);
    cb_cpu_set_max_level(prev);
    CHECK(cb_pack_q8_0_r16(&q, pk, need, pool) == CB_OK);
    CHECK(memcmp(pk, pk0, need) == 0);

    float *a = malloc(sizeof(float) * (size_t)cols), *b = malloc(sizeof(float) * (size_t)cols);
    int ok = 1;
    for (int32_t i = 0; i < rows; i++) {
        CHECK(cb_get_rows(&q, &i, 1, a) == CB_OK && cb_get_rows(&r, &i, 1, b) == CB_OK);
        ok &= memcmp(a, b, sizeof(float) * (size_t)cols) == 0;
    }
    CHECK(ok);

    enum { NT = 9 };
    float *x = malloc(sizeof(float) * (size_t)cols * NT);
    float *y0 = malloc(sizeof(float) * (size_t)rows * NT), *y1 = malloc(sizeof(float) * (size_t)rows * NT);
    float *ya = malloc(sizeof(float) * (size_t)rows * NT);
    for (int i = 0; i < cols * NT; i++) x[i] = (float)((int)(rnd() % 20001) - 10000) / 7000.0f;
    for (cb_simd_level lv = CB_SIMD_SCALAR; lv <= top; lv++) {
        prev = cb_cpu_set_max_level(lv);
        for (int n = 1; n <= NT; n++) {
            for (int th = 0; th < 2; th++) {
                cb_threadpool_t *p = th ? pool : NULL;
                CHECK(cb_matmul(&r, x, n, cols, y1, rows, p) == CB_OK);
                if (lv >= CB_SIMD_AVX2) {
                    CHECK(cb_matmul(&q, x, n, cols, y0, rows, p) == CB_OK);
                    CHECK(memcmp(y0, y1, sizeof(float) * (size_t)rows * (size_t)n) == 0);
                } else if (top >= CB_SIMD_AVX2) { /* the scalar tile: AVX2's float order */
                    cb_cpu_set_max_level(CB_SIMD_AVX2);
                    CHECK(cb_matmul(&q, x, n, cols, ya, rows, p) == CB_OK);
                    cb_cpu_set_max_level(lv);
                    CHECK(memcmp(ya, y1, sizeof(float) * (size_t)rows * (size_t)n) == 0);
                }
            }
        }
        cb_cpu_set_max_level(prev);
    }
    free(x); free(y0); free(y1); free(ya); free(a); free(b);
    free(w); free(pk); free(pk0);
}

int main(void) {
    cb_threadpool_t *pool = NULL;
    CHECK(cb_threadpool_new(2, &pool) == CB_OK);
    CHECK(cb_type_block_size(CB_TYPE_Q8_0_R16) == 32 && cb_type_block_bytes(CB_TYPE_Q8_0_R16) == 36);
    CHECK(strcmp(cb_type_name(CB_TYPE_Q8_0_R16), "Q8_0_R16") == 0);
    check_shape(16, 32, pool);
    check_shape(37, 640, pool);  /* a partial last group */
    check_shape(5, 96, pool);
    check_shape(100, 256, pool);

    /* refusals */
    uint8_t *w = random_q8_0(20, 64), *pk = aligned(cb_q8_0_r16_bytes(20, 64) + 64);
    cb_matrix_t q = {CB_TYPE_Q8_0, 20, 64, 68, w};
    size_t need = cb_q8_0_r16_bytes(20, 64);
    CHECK(cb_pack_q8_0_r16(&q, pk, need - 1, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_pack_q8_0_r16(&q, pk + 1, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_pack_q8_0_r16(&q, NULL, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    cb_matrix_t q4 = {CB_TYPE_Q4_0, 20, 64, 36, w};
    CHECK(cb_pack_q8_0_r16(&q4, pk, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_q8_0_r16_bytes(20, 48) == 0 && cb_q8_0_r16_bytes(-1, 64) == 0);
    CHECK(cb_pack_q8_0_r16(&q, pk, need, pool) == CB_OK);
    cb_matrix_t r = {CB_TYPE_Q8_0_R16, 20, 64, 72, pk};
    CHECK(cb_matrix_check(&r) == CB_OK);
    r.row_bytes = 80; /* the layout's stride is exact */
    CHECK(cb_matrix_check(&r) == CB_STATUS_INVALID_ARGUMENT);
    float out[64];
    CHECK(cb_dequantize_rows(CB_TYPE_Q8_0_R16, pk, 64, out) == CB_STATUS_UNSUPPORTED);
    r.row_bytes = 72;
    int32_t bad = 20;
    CHECK(cb_get_rows(&r, &bad, 1, out) == CB_STATUS_INVALID_ARGUMENT);
    free(w);
    free(pk);
    cb_threadpool_free(pool);
    TEST_MAIN_END("test_quant_r16");
}
