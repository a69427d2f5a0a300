/* The low-bit types' AVX-512 tiles (colibri/_core/quant_avx512_lowbit.c) against the scalar
 * kernels, on any x86-64 CPU: the source is compiled again here with CB_AVX512_EMULATE, on
 * SIMDe's portable AVX-512 (cb_avx512emu_lowbit_tile; the native copy, cb_avx512_lowbit_tile,
 * is checked the same way when the CPU has AVX-512). Every tile shape the matmul driver asks
 * for (one token 1..8 rows, 2..4 tokens 1..4 rows), without and with VNNI, random blocks with sane scales (every grid
 * index, sign and sub-block scale) and the adversarial ones (all-max scales, all signs set), rows
 * at odd strides: the outputs must equal the scalar dot products bit for bit (the design's
 * promise: batch invariance and equal results at every SIMD level rest on it). */
#define CB_AVX512_EMULATE 1
#include "quant_avx512_lowbit.c"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static const int TYPES[] = {CB_TYPE_Q2_K,    CB_TYPE_Q3_K,    CB_TYPE_TQ2_0, CB_TYPE_IQ4_XS,
                            CB_TYPE_IQ2_XXS, CB_TYPE_IQ3_XXS, CB_TYPE_IQ1_S};

static int d_offset(int type) {
    switch (type) {
    case CB_TYPE_Q2_K: return 80;
    case CB_TYPE_Q3_K: return 108;
    case CB_TYPE_TQ2_0: return 64;
    default: return 0;
    }
}

/* random bits (mode 0) or all bits set (mode 1, the extreme scales and signs), then sane f16 d
 * (and Q2_K's dmin) */
static void fill(int type, uint8_t *raw, size_t rb, int rows, size_t stride, int mode) {
    for (size_t i = 0; i < stride * (size_t)rows; i++) raw[i] = mode ? 0xFF : (uint8_t)rnd();
    const size_t bb = cb_type_block_bytes(type);
    for (int r = 0; r < rows; r++)
        for (size_t b = 0; b < rb / bb; b++) {
            uint8_t *p = raw + (size_t)r * stride + b * bb;
            uint16_t h = cb_f32_to_f16((0.2f + 1.8f * (float)(rnd() % 1000) / 1000.0f) / 64.0f);
            memcpy(p + d_offset(type), &h, 2);
            if (type == CB_TYPE_Q2_K) memcpy(p + 82, &h, 2);
        }
}

static int check_tiles(const char *what, cb_tile_fn tile, int type) {
    const int cols = 1024, nb = cols / 256, max_rows = 8, max_tok = 4;
    size_t rb = 0;
    CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
    const size_t stride = rb + 5;
    uint8_t *raw = malloc(stride * (size_t)max_rows);
    float *x = malloc(sizeof(float) * (size_t)cols);
    cb_q8k_t *xa = malloc(sizeof(cb_q8k_t) * (size_t)(nb * max_tok));
    cb_dot_fn dot = cb_scalar_dot(type);
    int bad = 0;
    for (int mode = 0; mode < 2; mode++)
        for (int rep = 0; rep < 3; rep++) {
            fill(type, raw, rb, max_rows, stride, mode);
            for (int t = 0; t < max_tok; t++) {
                for (int c = 0; c < cols; c++)
                    x[c] = (float)((int)(rnd() % 2001) - 1000) / 300.0f * (rep == 2 && c % 7 ? 0.0f : 1.0f);
                cb_scalar_quantize_q8k(x, cols, xa + (size_t)t * nb);
            }
            for (int nt = 1; nt <= max_tok; nt++)
                for (int nr = 1; nr <= (nt == 1 ? max_rows : 4); nr++) {
                    float out[32];
                    tile(nb, raw, stride, nr, (const uint8_t *)xa, sizeof(cb_q8k_t) * (size_t)nb, nt, out);
                    for (int r = 0; r < nr; r++)
                        for (int t = 0; t < nt; t++) {
                            float ref = dot(nb, raw + (size_t)r * stride, (const uint8_t *)(xa + (size_t)t * nb));
                            uint32_t a, b;
                            memcpy(&a, &out[r * nt + t], 4);
                            memcpy(&b, &ref, 4);
                            if (a != b && bad++ < 5)
                                fprintf(stderr, "%s %s mode %d %dx%d (%d,%d): %.9g, scalar %.9g\n", what,
                                        cb_type_name(type), mode, nr, nt, r, t, out[r * nt + t], ref);
                        }
                }
        }
    free(raw);
    free(x);
    free(xa);
    return bad;
}

int main(void) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++) {
        for (int vnni = 0; vnni < 2; vnni++) {
            cb_tile_fn emu = cb_avx512emu_lowbit_tile(TYPES[i], vnni);
            CHECK(emu != NULL);
            CHECK(check_tiles(vnni ? "emulated vnni" : "emulated", emu, TYPES[i]) == 0);
            if (cb_cpu_detect() >= (vnni ? CB_SIMD_AVX512_VNNI : CB_SIMD_AVX512)) {
                cb_tile_fn nat = cb_avx512_lowbit_tile(TYPES[i], vnni);
                CHECK(nat != NULL);
                CHECK(check_tiles(vnni ? "native vnni" : "native", nat, TYPES[i]) == 0);
            }
        }
    }
    CHECK(cb_avx512emu_lowbit_tile(CB_TYPE_Q4_K, 1) == NULL);
    TEST_MAIN_END("test_quant_avx512_lowbit");
}
