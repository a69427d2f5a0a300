/* Attention's score rows (cb_dot_rows_multi_f32, and _f16 on f16 rows) at every SIMD level
 * against one scalar reference of their summation order, bit for bit:
 *   - the AVX-512 kernel (colibri/_core/ops_avx512.c) compiled again here on SIMDe
 *     (CB_AVX512_EMULATE: cb_avx512emu_dot_rows8_t), so its code is checked on any x86-64 CPU,
 *     and its native copy (cb_avx512_dot_rows8_t) where the CPU has AVX-512;
 *   - cb_dot_rows_multi_f32 whole at the best level, and capped to AVX2, against the reference
 *     (the AVX2 and AVX-512 paths must give the same bits: the logits do not depend on the
 *     machine's vector width).
 * The reference: per row and head four 8-lane accumulators s_c (s_c[l] += q[i + 8c + l] *
 * k[i + 8c + l] by fmaf, i = 0, 32, ...), t = (s0 + s1) + (s2 + s3), then w_l = t_l + t_(l+4)
 * and (w0 + w2) + (w1 + w3), times the scale. A kernel that sums in another order fails here. */
#define CB_AVX512_EMULATE 1
#include "ops_avx512.c"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/ops.h"
#include "testutil.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float rnd(void) { /* a float in (-2, 2) with a full mantissa */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static void ref_t(const float *q, const float *k, int64_t n, float *t) {
    float s[4][8];
    memset(s, 0, sizeof s);
    for (int64_t i = 0; i < n; i += 32)
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 8; l++) s[c][l] = fmaf(q[i + 8 * c + l], k[i + 8 * c + l], s[c][l]);
    for (int l = 0; l < 8; l++) t[l] = (s[0][l] + s[1][l]) + (s[2][l] + s[3][l]);
}

static float ref_score(const float *q, const float *k, int64_t n, float scale) {
    float t[8], w[4];
    ref_t(q, k, n, t);
    for (int l = 0; l < 4; l++) w[l] = t[l] + t[l + 4];
    return scale * ((w[0] + w[2]) + (w[1] + w[3]));
}

typedef void (*rows8_fn)(const float *, int64_t, int, const float *, int64_t, int64_t, float *);
typedef void (*rows8_f16_fn)(const float *, int64_t, int, const uint16_t *, int64_t, int64_t, float *);

/* the kernel's partial sums of 8 rows x n_q heads against the reference's (f16 rows: fn16, on
 * the rows rounded to f16, the reference on them widened) */
static void check_kernel(rows8_fn fn, rows8_f16_fn fn16, const char *name) {
    static const int64_t ns[] = {32, 64, 128, 256, 512};
    int bad = 0;
    for (int trial = 0; trial < 200; trial++) {
        const int64_t n = ns[trial % 5];
        const int n_q = 1 + trial % 8;
        const int64_t qs = n + 8 * (trial % 3), ks = n + 16 * (trial % 4);
        float *q = malloc(sizeof(float) * (size_t)(n_q * qs)), *k = malloc(sizeof(float) * (size_t)(8 * ks));
        float t[8 * 64], r[8];
        for (int64_t i = 0; i < n_q * qs; i++) q[i] = rnd();
        for (int64_t i = 0; i < 8 * ks; i++) k[i] = rnd();
        if (fn16) {
            uint16_t *kh = malloc(sizeof(uint16_t) * (size_t)(8 * ks));
            for (int64_t i = 0; i < 8 * ks; i++) {
                kh[i] = cb_f32_to_f16(k[i]);
                k[i] = cb_f16_to_f32(kh[i]);
            }
            fn16(q, qs, n_q, kh, ks, n, t);
            free(kh);
        } else {
            fn(q, qs, n_q, k, ks, n, t);
        }
        for (int h = 0; h < n_q; h++)
            for (int row = 0; row < 8; row++) {
                ref_t(q + h * qs, k + row * ks, n, r);
                if (memcmp(r, t + (h * 8 + row) * 8, sizeof r)) bad++;
            }
        free(q);
        free(k);
    }
    if (bad) fprintf(stderr, "%s: %d (head, row) partial sums differ from the reference\n", name, bad);
    CHECK(bad == 0);
}

/* cb_dot_rows_multi_f32 at the level in use against the reference: ragged row counts (the
 * rows past the last 8 take the one-row path), heads past 8 (the kernel's head chunks), n not a
 * multiple of 32 (no vector path) */
static void check_rows(const char *level, int f16) {
    int bad = 0;
    for (int trial = 0; trial < 120; trial++) {
        const int64_t n = trial % 10 == 9 ? 40 : 32 << (trial % 4);
        const int n_q = 1 + trial % 12;
        const int64_t rows = 1 + (trial * 7) % 45, qs = n + 8 * (trial % 2), ks = n + 32 * (trial % 3);
        const int64_t os = rows + trial % 5;
        float *q = malloc(sizeof(float) * (size_t)(n_q * qs)), *k = malloc(sizeof(float) * (size_t)(rows * ks));
        float *out = malloc(sizeof(float) * (size_t)(n_q * os));
        for (int64_t i = 0; i < n_q * qs; i++) q[i] = rnd();
        for (int64_t i = 0; i < rows * ks; i++) k[i] = rnd();
        const float scale = 0.125f + 0.01f * (float)trial;
        if (f16) {
            uint16_t *kh = malloc(sizeof(uint16_t) * (size_t)(rows * ks));
            for (int64_t i = 0; i < rows * ks; i++) {
                kh[i] = cb_f32_to_f16(k[i]);
                k[i] = cb_f16_to_f32(kh[i]);
            }
            CHECK(cb_dot_rows_multi_f16(q, qs, n_q, kh, rows, ks, n, scale, out, os) == CB_OK);
            free(kh);
        } else {
            CHECK(cb_dot_rows_multi_f32(q, qs, n_q, k, rows, ks, n, scale, out, os) == CB_OK);
        }
        if (n % 32 == 0) /* the reference's lanes need n a multiple of 32 */
            for (int h = 0; h < n_q; h++)
                for (int64_t j = 0; j < rows; j++) {
                    const float want = ref_score(q + h * qs, k + j * ks, n, scale);
                    if (memcmp(&want, &out[h * os + j], sizeof want)) bad++;
                }
        free(q);
        free(k);
        free(out);
    }
    if (bad)
        fprintf(stderr, "cb_dot_rows_multi_%s at %s: %d scores differ from the reference\n",
                f16 ? "f16" : "f32", level, bad);
    CHECK(bad == 0);
}

int main(void) {
    check_kernel(cb_avx512emu_dot_rows8_t, NULL, "emulated AVX-512 kernel");
    check_kernel(NULL, cb_avx512emu_dot_rows8_t_f16, "emulated AVX-512 kernel, f16 rows");
    const cb_simd_level cpu = cb_cpu_detect();
    if (cpu >= CB_SIMD_AVX512) {
        check_kernel(cb_avx512_dot_rows8_t, NULL, "native AVX-512 kernel");
        check_kernel(NULL, cb_avx512_dot_rows8_t_f16, "native AVX-512 kernel, f16 rows");
    } else {
        printf("test_ops_avx512: no AVX-512 on this CPU: the native kernels are not run (the emulated ones were)\n");
    }
    if (cpu >= CB_SIMD_AVX2) {
        for (int f16 = 0; f16 < 2; f16++) {
            check_rows(cb_simd_level_str(cb_cpu_level()), f16);
            const cb_simd_level prev = cb_cpu_set_max_level(CB_SIMD_AVX2);
            check_rows("avx2", f16);
            cb_cpu_set_max_level(prev);
        }
    } else {
        printf("test_ops_avx512: no AVX2 on this CPU: the scalar path sums in another order\n");
    }
    TEST_MAIN_END("test_ops_avx512");
}
