/* The low-bit types in C (quant_lowbit.c, quant_iq.c, quant_avx2_lowbit.c), under ASan/UBSan:
 * every type's dequantizer and matmul over random bits (any scale: NaN and Inf too, which must
 * not trip the sanitizers) on rows whose stride is odd (blocks at every byte alignment, as
 * experts and mapped tensors are); over sane scales, the matmul at every SIMD level bit for bit
 * equal to the scalar level, and every token's row equal to that token alone whatever the
 * token count (batch invariance), 1 and 2 threads. */
#include <math.h>
#include <stdint.h>
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

static const int TYPES[] = {CB_TYPE_Q2_K,   CB_TYPE_Q3_K,    CB_TYPE_Q8_K,   CB_TYPE_TQ1_0,
                            CB_TYPE_TQ2_0,  CB_TYPE_IQ1_S,   CB_TYPE_IQ1_M,  CB_TYPE_IQ2_XXS,
                            CB_TYPE_IQ2_XS, CB_TYPE_IQ2_S,   CB_TYPE_IQ3_XXS, CB_TYPE_IQ3_S,
                            CB_TYPE_IQ4_NL, CB_TYPE_IQ4_XS};

/* the f16 scale fields of a block (-1: none) */
static void scale_offsets(int type, int off[2]) {
    off[0] = off[1] = -1;
    switch (type) {
    case CB_TYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case CB_TYPE_Q3_K: off[0] = 108; break;
    case CB_TYPE_TQ1_0: off[0] = 52; break;
    case CB_TYPE_TQ2_0: off[0] = 64; break;
    case CB_TYPE_Q8_K: case CB_TYPE_IQ1_M: break;
    default: off[0] = 0; break;
    }
}

/* random bits; sane: small finite scales */
static void fill(int type, uint8_t *raw, size_t rb, int rows, size_t stride, int sane) {
    for (size_t i = 0; i < stride * (size_t)rows; i++) raw[i] = (uint8_t)rnd();
    if (!sane) return;
    size_t bb = cb_type_block_bytes(type);
    int off[2];
    scale_offsets(type, off);
    for (int r = 0; r < rows; r++)
        for (size_t b = 0; b < rb / bb; b++) {
            uint8_t *p = raw + (size_t)r * stride + b * bb;
            float d = (0.2f + 1.8f * (float)(rnd() % 1000) / 1000.0f) / 64.0f;
            uint16_t h = cb_f32_to_f16(d);
            for (int k = 0; k < 2; k++)
                if (off[k] >= 0) memcpy(p + off[k], &h, 2);
            if (type == CB_TYPE_Q8_K) memcpy(p, &d, 4);
            if (type == CB_TYPE_IQ1_M)
                for (int k = 0; k < 4; k++) { /* d's nibble k in the top of scale word k */
                    uint16_t s;
                    memcpy(&s, p + 48 + 2 * k, 2);
                    s = (uint16_t)((s & 0x0FFFu) | (((h >> (4 * k)) & 0xFu) << 12));
                    memcpy(p + 48 + 2 * k, &s, 2);
                }
        }
}

static int same_bits(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y || (isnan(a) && isnan(b));
}

static void test_type(int type, cb_threadpool_t *pool) {
    const int rows = 11, n_tok = 9;
    const int cols = cb_type_block_size(type) == 256 ? 768 : 96;
    size_t rb = 0;
    CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
    const size_t stride = rb + 3; /* rows at every alignment */
    uint8_t *raw = malloc(stride * rows);
    float *w = malloc(sizeof(float) * (size_t)cols);
    float *x = malloc(sizeof(float) * (size_t)n_tok * cols);
    float *ref = malloc(sizeof(float) * (size_t)n_tok * rows);
    float *y = malloc(sizeof(float) * (size_t)n_tok * rows);
    for (int i = 0; i < n_tok * cols; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) / 300.0f;
    cb_matrix_t m = {type, rows, cols, stride, raw};

    /* any bits: dequantize every row and multiply, at every level (no sanitizer finding) */
    fill(type, raw, rb, rows, stride, 0);
    for (int r = 0; r < rows; r++)
        CHECK(cb_dequantize_rows(type, raw + (size_t)r * stride, cols, w) == CB_OK);
    int32_t ids[3] = {10, 0, 5};
    float *g = malloc(sizeof(float) * 3 * (size_t)cols);
    CHECK(cb_get_rows(&m, ids, 3, g) == CB_OK);
    CHECK(cb_dequantize_rows(type, raw + 5 * stride, cols, w) == CB_OK);
    int ok = 1;
    for (int c = 0; c < cols; c++) ok &= same_bits(g[2 * cols + c], w[c]);
    CHECK(ok);
    free(g);
    for (cb_simd_level lv = CB_SIMD_SCALAR; lv <= cb_cpu_detect(); lv++) {
        cb_simd_level prev = cb_cpu_set_max_level(lv);
        CHECK(cb_matmul(&m, x, n_tok, cols, y, rows, pool) == CB_OK);
        cb_cpu_set_max_level(prev);
    }

    /* sane scales: every level equals the scalar one bit for bit; batch invariance */
    fill(type, raw, rb, rows, stride, 1);
    cb_simd_level prev = cb_cpu_set_max_level(CB_SIMD_SCALAR);
    CHECK(cb_matmul(&m, x, n_tok, cols, ref, rows, NULL) == CB_OK);
    cb_cpu_set_max_level(prev);
    for (cb_simd_level lv = CB_SIMD_SCALAR; lv <= cb_cpu_detect(); lv++) {
        prev = cb_cpu_set_max_level(lv);
        for (int n = 1; n <= n_tok; n++) {
            CHECK(cb_matmul(&m, x, n, cols, y, rows, n % 2 ? pool : NULL) == CB_OK);
            int eq = 1;
            for (int i = 0; i < n * rows; i++) eq &= same_bits(y[i], ref[i]) && isfinite(y[i]);
            if (!eq)
                fprintf(stderr, "%s at %s, %d tokens: not the scalar result\n",
                        cb_type_name(type), cb_simd_level_str(lv), n);
            CHECK(eq);
        }
        cb_cpu_set_max_level(prev);
    }
    free(raw);
    free(w);
    free(x);
    free(ref);
    free(y);
}

int main(void) {
    cb_threadpool_t *pool = NULL;
    CHECK(cb_threadpool_new(2, &pool) == CB_OK);
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        CHECK(cb_type_supported(TYPES[i]));
        test_type(TYPES[i], pool);
    }
    cb_threadpool_free(pool);
    TEST_MAIN_END("test_quant_lowbit");
}
