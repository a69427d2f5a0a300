/* The R16 layouts (Q8_0_R16, Q5_0_R16, Q6_K_R16, Q4_K_R16) in C, under ASan/UBSan: the packing is the same on 1 and
 * 2 threads, every row read back equals the source row, and matmul on the layout equals matmul
 * on the source matrix bit for bit (1-9 tokens, 1 and 2 threads, a partial last group) at every
 * level from AVX2 up; at the scalar level the layout's tile equals the AVX2 level's products.
 * Bad arguments are refused. */
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

static int is_k(int type) { return type == CB_TYPE_Q6_K || type == CB_TYPE_Q4_K; }
static size_t block_bytes(int type) { return cb_type_block_bytes(type); }
static size_t row_bytes(int type, int cols) { return (size_t)cols / (is_k(type) ? 256 : 32) * block_bytes(type); }

/* rows x cols of type (Q8_0 / Q5_0 / Q6_K / Q4_K) with random payload (scales and mins) and
 * finite d (and Q4_K's dmin) of both signs (incl. subnormal) */
static uint8_t *random_rows(int type, int rows, int cols) {
    const size_t bb = block_bytes(type), rb = row_bytes(type, cols);
    const size_t d_at = type == CB_TYPE_Q6_K ? 208 : 0;
    uint8_t *w = aligned(rb * (size_t)rows);
    for (size_t b = 0; b < rb * (size_t)rows / bb; b++) {
        uint8_t *blk = w + bb * b;
        for (size_t k = 0; k < bb; k++) blk[k] = (uint8_t)rnd();
        uint16_t d = (uint16_t)(rnd() % 7 == 0 ? rnd() % 0x400 : 0x2000 + rnd() % 0x1800);
        d |= (uint16_t)(rnd() & 1) << 15;
        memcpy(blk + d_at, &d, 2);
        if (type == CB_TYPE_Q4_K) { /* dmin */
            d = (uint16_t)((rnd() % 7 == 0 ? rnd() % 0x400 : 0x2000 + rnd() % 0x1800) | (rnd() & 1) << 15);
            memcpy(blk + 2, &d, 2);
        }
    }
    return w;
}

static void check_shape(int type, int rows, int cols, cb_threadpool_t *pool) {
    const int layout = cb_r16_layout(type);
    size_t rb = row_bytes(type, cols);
    size_t need = cb_r16_bytes(layout, rows, cols);
    CHECK(layout != 0 && need == (size_t)((rows + 15) / 16) * 16 * rb);
    uint8_t *w = random_rows(type, rows, cols), *pk = aligned(need), *pk0 = aligned(need);
    cb_matrix_t q = {type, rows, cols, rb, w};
    cb_matrix_t r = {layout, rows, cols, rb, pk};
    cb_simd_level top = cb_cpu_detect();
    cb_simd_level prev;
    CHECK(cb_pack_r16(&q, pk0, need, NULL) == CB_OK);
    CHECK(cb_pack_r16(&q, pk, need, pool) == CB_OK);
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
    CHECK(cb_type_block_size(CB_TYPE_Q8_0_R16) == 32 && cb_type_block_bytes(CB_TYPE_Q8_0_R16) == 34);
    CHECK(strcmp(cb_type_name(CB_TYPE_Q8_0_R16), "Q8_0_R16") == 0);
    CHECK(cb_type_block_size(CB_TYPE_Q5_0_R16) == 32 && cb_type_block_bytes(CB_TYPE_Q5_0_R16) == 22);
    CHECK(cb_type_block_size(CB_TYPE_Q6_K_R16) == 256 && cb_type_block_bytes(CB_TYPE_Q6_K_R16) == 210);
    for (int i = 0; i < 2; i++) {
        const int type = i ? CB_TYPE_Q5_0 : CB_TYPE_Q8_0;
        check_shape(type, 16, 32, pool);
        check_shape(type, 37, 640, pool); /* a partial last group */
        check_shape(type, 5, 96, pool);
        check_shape(type, 100, 256, pool);
    }
    for (int i = 0; i < 2; i++) {
        const int type = i ? CB_TYPE_Q4_K : CB_TYPE_Q6_K;
        check_shape(type, 16, 256, pool);
        check_shape(type, 37, 768, pool);
        check_shape(type, 5, 512, pool);
    }
    CHECK(cb_type_block_size(CB_TYPE_Q4_K_R16) == 256 && cb_type_block_bytes(CB_TYPE_Q4_K_R16) == 144);
    CHECK(cb_r16_layout(CB_TYPE_Q4_K) == CB_TYPE_Q4_K_R16 && cb_r16_layout(CB_TYPE_Q5_K) == 0);
    CHECK(cb_r16_bytes(CB_TYPE_Q6_K_R16, 20, 128) == 0 && cb_r16_layout(CB_TYPE_Q6_K) == CB_TYPE_Q6_K_R16);

    /* refusals */
    size_t need = cb_r16_bytes(CB_TYPE_Q8_0_R16, 20, 64);
    uint8_t *w = random_rows(CB_TYPE_Q8_0, 20, 64), *pk = aligned(need + 64);
    cb_matrix_t q = {CB_TYPE_Q8_0, 20, 64, 68, w};
    CHECK(cb_pack_r16(&q, pk, need - 1, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_pack_r16(&q, pk + 1, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_pack_r16(&q, NULL, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    cb_matrix_t q4 = {CB_TYPE_Q4_0, 20, 64, 36, w};
    CHECK(cb_pack_r16(&q4, pk, need, pool) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_r16_bytes(CB_TYPE_Q8_0_R16, 20, 48) == 0 && cb_r16_bytes(CB_TYPE_Q8_0_R16, -1, 64) == 0);
    CHECK(cb_r16_bytes(CB_TYPE_Q8_0, 20, 64) == 0 && cb_r16_layout(CB_TYPE_Q4_1) == 0);
    CHECK(cb_pack_r16(&q, pk, need, pool) == CB_OK);
    cb_matrix_t r = {CB_TYPE_Q8_0_R16, 20, 64, 68, pk};
    CHECK(cb_matrix_check(&r) == CB_OK);
    r.row_bytes = 80; /* the layout's stride is exact */
    CHECK(cb_matrix_check(&r) == CB_STATUS_INVALID_ARGUMENT);
    float out[64];
    CHECK(cb_dequantize_rows(CB_TYPE_Q8_0_R16, pk, 64, out) == CB_STATUS_UNSUPPORTED);
    CHECK(cb_dequantize_rows(CB_TYPE_Q5_0_R16, pk, 64, out) == CB_STATUS_UNSUPPORTED);
    r.row_bytes = 68;
    int32_t bad = 20;
    CHECK(cb_get_rows(&r, &bad, 1, out) == CB_STATUS_INVALID_ARGUMENT);
    free(w);
    free(pk);
    cb_threadpool_free(pool);
    TEST_MAIN_END("test_r16");
}
