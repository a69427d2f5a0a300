/* Quant kernels in C: type table, f16 conversion round trips, dequantizers on hand-built
 * blocks, and matmul (scalar and AVX2, 1 and 2 threads) against a double-precision product of
 * the dequantized weights within the activation-quantization bound (see quant.h); batch
 * invariance: every token's row bit-equal to that token alone, whatever the token count, the
 * path (direct tiles, packed rows) and the threads. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/quant.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

static const int TYPES[] = {CB_TYPE_F32,  CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0,
                            CB_TYPE_Q4_1, CB_TYPE_Q5_0, CB_TYPE_Q5_1, CB_TYPE_Q8_0,
                            CB_TYPE_MXFP4, CB_TYPE_Q4_K, CB_TYPE_Q5_K, CB_TYPE_Q6_K,
                            CB_TYPE_I4_G128};

/* random valid raw blocks: random bits, finite small scales */
static void fill(int type, uint8_t *raw, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rnd();
    size_t bb = cb_type_block_bytes(type);
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *p = raw + b * bb;
        uint16_t h1 = cb_f32_to_f16(0.01f + 0.02f * (float)(rnd() % 100) / 100.0f);
        uint16_t h2 = cb_f32_to_f16(0.005f);
        switch (type) {
        case CB_TYPE_F32: { float f = rndf(); memcpy(p, &f, 4); break; }
        case CB_TYPE_F16: { uint16_t h = cb_f32_to_f16(rndf()); memcpy(p, &h, 2); break; }
        case CB_TYPE_BF16: { float f = rndf(); uint32_t u; memcpy(&u, &f, 4); uint16_t h = (uint16_t)(u >> 16); memcpy(p, &h, 2); break; }
        case CB_TYPE_Q4_1: case CB_TYPE_Q5_1: case CB_TYPE_Q4_K: case CB_TYPE_Q5_K:
            memcpy(p, &h1, 2); memcpy(p + 2, &h2, 2); break;
        case CB_TYPE_Q6_K: memcpy(p + 208, &h1, 2); break;
        case CB_TYPE_MXFP4: p[0] = (uint8_t)(120 + rnd() % 8); break;
        default: memcpy(p, &h1, 2); break;
        }
    }
}

static void test_matmul(int type, int rows, int cols, int n_tokens, cb_threadpool_t *pool) {
    size_t rb = 0;
    CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
    uint8_t *raw = malloc(rb * (size_t)rows);
    float *w = malloc(sizeof(float) * (size_t)rows * (size_t)cols);
    float *x = malloc(sizeof(float) * (size_t)n_tokens * (size_t)cols);
    float *y = malloc(sizeof(float) * (size_t)n_tokens * (size_t)rows);
    fill(type, raw, rb * (size_t)rows);
    CHECK(cb_dequantize_rows(type, raw, (int64_t)rows * cols, w) == CB_OK);
    for (int i = 0; i < n_tokens * cols; i++) x[i] = rndf() * 3.0f;
    cb_matrix_t m = {type, rows, cols, rb, raw};
    CHECK(cb_matmul(&m, x, n_tokens, cols, y, rows, pool) == CB_OK);
    int ab = cb_type_block_size(type) == 1 ? 0 : (cb_type_block_size(type) == 256 ? 256 : 32);
    int ok = 1;
    for (int t = 0; t < n_tokens; t++)
        for (int r = 0; r < rows; r++) {
            double ref = 0, bound = 0, mag = 0;
            for (int b0 = 0; b0 < cols; b0 += (ab ? ab : cols)) {
                int len = ab ? ab : cols;
                double amax = 0, wsum = 0;
                for (int c = b0; c < b0 + len; c++) {
                    ref += (double)w[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                    amax = fmax(amax, fabs(x[(size_t)t * cols + c]));
                    wsum += fabs(w[(size_t)r * cols + c]);
                    mag += fabs(w[(size_t)r * cols + c] * x[(size_t)t * cols + c]);
                }
                if (ab) bound += amax / 254.0 * wsum;
            }
            bound = bound * 1.001 + 1e-5 * mag + 1e-30;
            if (!(fabs(y[(size_t)t * rows + r] - ref) <= bound)) {
                if (ok)
                    fprintf(stderr, "%s %s %dx%d n=%d: y[%d,%d]=%g ref=%g bound=%g\n",
                            cb_type_name(type), cb_simd_level_str(cb_cpu_level()), rows, cols,
                            n_tokens, t, r, y[(size_t)t * rows + r], ref, bound);
                ok = 0;
            }
        }
    CHECK(ok);
    free(raw);
    free(w);
    free(x);
    free(y);
}

/* Batch invariance: y rows of a call with n tokens (1..max_n, every path: packed auto, forced
 * on, forced off; with the pool and without) bit-equal to each token's single-token call
 * (the decode path). */
static void test_invariant(int type, int rows, int cols, int max_n, cb_threadpool_t *pool) {
    size_t rb = 0;
    CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
    uint8_t *raw = malloc(rb * (size_t)rows);
    float *x = malloc(sizeof(float) * (size_t)max_n * (size_t)cols);
    float *y1 = malloc(sizeof(float) * (size_t)max_n * (size_t)rows);
    float *y = malloc(sizeof(float) * (size_t)max_n * (size_t)rows);
    fill(type, raw, rb * (size_t)rows);
    for (int i = 0; i < max_n * cols; i++) x[i] = rndf() * 3.0f;
    cb_matrix_t m = {type, rows, cols, rb, raw};
    for (int t = 0; t < max_n; t++)
        CHECK(cb_matmul(&m, x + (size_t)t * cols, 1, cols, y1 + (size_t)t * rows, rows, NULL) ==
              CB_OK);
    int ok = 1;
    for (int n = 1; n <= max_n && ok; n++)
        for (int packed = -1; packed <= 1 && ok; packed++) {
            cb_matmul_opts_t o = cb_matmul_default_opts();
            o.packed = packed;
            CHECK(cb_matmul_ex(&m, x, n, cols, y, rows, &o, (n & 1) ? pool : NULL) == CB_OK);
            if (memcmp(y, y1, sizeof(float) * (size_t)n * (size_t)rows) != 0) {
                fprintf(stderr, "%s %s n=%d packed=%d: rows differ from single-token calls\n",
                        cb_type_name(type), cb_simd_level_str(cb_cpu_level()), n, packed);
                ok = 0;
            }
        }
    CHECK(ok);
    free(raw);
    free(x);
    free(y1);
    free(y);
}

int main(void) {
    /* type table */
    CHECK(cb_type_block_size(CB_TYPE_Q4_K) == 256 && cb_type_block_bytes(CB_TYPE_Q4_K) == 144);
    CHECK(cb_type_block_bytes(CB_TYPE_MXFP4) == 17 && cb_type_block_bytes(CB_TYPE_Q6_K) == 210);
    CHECK(cb_type_block_size(5) == 0 && strcmp(cb_type_name(5), "unknown") == 0);
    CHECK(!cb_type_supported(CB_TYPE_Q8_1) && cb_type_supported(CB_TYPE_Q2_K) && cb_type_supported(CB_TYPE_IQ1_M));
    size_t rb;
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, 64, &rb) == CB_OK && rb == 68);
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, 65, &rb) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_type_row_bytes(CB_TYPE_Q8_0, -32, &rb) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_type_row_bytes(99, 32, &rb) == CB_STATUS_UNSUPPORTED);

    /* f16: every finite half survives f16 -> f32 -> f16 */
    int ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue; /* NaN */
        ok &= cb_f32_to_f16(cb_f16_to_f32((uint16_t)h)) == h;
    }
    CHECK(ok);
    CHECK(cb_f16_to_f32(0x3C00) == 1.0f && cb_f16_to_f32(0xC000) == -2.0f);
    CHECK(cb_f32_to_f16(65520.0f) == 0x7C00 && cb_f32_to_f16(65519.0f) == 0x7BFF);
    CHECK(cb_f32_to_f16(1.0f + 1.0f / 2048.0f) == 0x3C00); /* tie to even */

    /* hand-built Q4_0 block: d = 0.5, values q-8 */
    uint8_t blk[18];
    uint16_t half = 0x3800; /* 0.5 */
    memcpy(blk, &half, 2);
    for (int j = 0; j < 16; j++) blk[2 + j] = (uint8_t)(j | (15 - j) << 4);
    float out[32];
    CHECK(cb_dequantize_rows(CB_TYPE_Q4_0, blk, 32, out) == CB_OK);
    CHECK(out[0] == -4.0f && out[15] == 3.5f && out[16] == 3.5f && out[31] == -4.0f);
    CHECK(cb_dequantize_rows(CB_TYPE_Q4_0, blk, 31, out) == CB_STATUS_INVALID_ARGUMENT);

    /* get_rows: out of range id refused before writing */
    cb_matrix_t m = {CB_TYPE_Q4_0, 1, 32, 18, blk};
    int32_t ids[2] = {0, 1};
    out[0] = 123.0f;
    CHECK(cb_get_rows(&m, ids + 1, 1, out) == CB_STATUS_INVALID_ARGUMENT && out[0] == 123.0f);
    CHECK(cb_get_rows(&m, ids, 1, out) == CB_OK && out[0] == -4.0f);
    m.row_bytes = 17;
    CHECK(cb_matrix_check(&m) == CB_STATUS_INVALID_ARGUMENT);
    m.row_bytes = 18;
    float y[4];
    CHECK(cb_matmul(&m, out, 1, 16, y, 1, NULL) == CB_STATUS_INVALID_ARGUMENT);

    cb_threadpool_t *pool = NULL;
    CHECK(cb_threadpool_new(2, &pool) == CB_OK);
    cb_simd_level levels[2] = {CB_SIMD_SCALAR, cb_cpu_detect()};
    for (int l = 0; l < 2; l++) {
        cb_simd_level prev = cb_cpu_set_max_level(levels[l]);
        for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++) {
            int t = TYPES[k];
            int64_t bs = cb_type_block_size(t);
            int cols = bs == 256 ? 512 : (bs == 128 ? 384 : (bs == 1 ? 77 : 96));
            test_matmul(t, 9, cols, 1, NULL);
            test_matmul(t, 13, cols, 6, pool);
            test_matmul(t, 21, cols, 11, NULL); /* packed rows: a partial group and tile */
            test_invariant(t, 21, cols, 30, pool);
            /* decode reads rows one after another, blocks in groups (4 or 8 super-blocks, 8
             * blocks) and chunks (64 blocks): rows long enough for partial groups and chunks */
            if (bs == 256 || bs == 32) test_invariant(t, 11, bs == 256 ? 2304 : 2400, 6, pool);
        }
        cb_cpu_set_max_level(prev);
    }
    /* an AVX-512 CPU also checks the lower levels' invariance (what an AVX2 CPU runs, and
     * AVX-512 without VNNI) */
    for (cb_simd_level lv = CB_SIMD_AVX2; lv < cb_cpu_detect(); lv++) {
        cb_simd_level prev = cb_cpu_set_max_level(lv);
        for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++) {
            int64_t bs = cb_type_block_size(TYPES[k]);
            int cols = bs == 256 ? 512 : (bs == 128 ? 384 : (bs == 1 ? 77 : 96));
            test_invariant(TYPES[k], 21, cols, 30, pool);
        }
        cb_cpu_set_max_level(prev);
    }
    cb_threadpool_free(pool);
    TEST_MAIN_END("test_quant");
}
