/* ops.h under ASan/UBSan: every op against a double-precision reference on odd lengths (the
 * SIMD tails), at both SIMD levels; argument errors; edge values (-inf rows, huge inputs). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "colibri/cpu.h"
#include "colibri/ops.h"
#include "colibri/quant.h"
#include "testutil.h"

#define N_MAX 67

static uint32_t rng_state = 12345u;
static float frand(void) { /* uniform in [-4, 4) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return ((float)(rng_state >> 8) / 16777216.0f) * 8.0f - 4.0f;
}

static int close_to(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static void check_level(cb_simd_level level) {
    cb_cpu_set_max_level(level);
    float x[N_MAX], y[N_MAX], w[N_MAX], out[N_MAX];
    for (int n = 1; n <= N_MAX; n += 3) {
        for (int i = 0; i < n; i++) x[i] = frand(), y[i] = frand(), w[i] = frand();
        /* rmsnorm, with and without the unit offset and the weight */
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
        double sc = 1.0 / sqrt(ss / n + 1e-5);
        CHECK(cb_rmsnorm(x, w, n, 1e-5f, 0, out) == CB_OK);
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], x[i] * sc * w[i], 1e-5, 1e-6);
        CHECK(ok);
        CHECK(cb_rmsnorm(x, w, n, 1e-5f, 1, out) == CB_OK);
        ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], x[i] * sc * (1.0 + w[i]), 1e-5, 1e-6);
        CHECK(ok);
        memcpy(out, x, sizeof(float) * n);
        CHECK(cb_rmsnorm(out, NULL, n, 1e-5f, 0, out) == CB_OK); /* in place */
        ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], x[i] * sc, 1e-5, 1e-6);
        CHECK(ok);
        /* softmax */
        memcpy(out, x, sizeof(float) * n);
        CHECK(cb_softmax(out, n) == CB_OK);
        double m = -INFINITY, sum = 0;
        for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        for (int i = 0; i < n; i++) sum += exp((double)x[i] - m);
        ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], exp((double)x[i] - m) / sum, 1e-5, 1e-7);
        CHECK(ok);
        /* activations and gates */
        CHECK(cb_glu(CB_ACT_SILU, x, y, n, out) == CB_OK);
        ok = 1;
        for (int i = 0; i < n; i++)
            ok &= close_to(out[i], x[i] / (1.0 + exp(-(double)x[i])) * y[i], 1e-5, 1e-6);
        CHECK(ok);
        CHECK(cb_gelu_tanh(x, n, out) == CB_OK);
        ok = 1;
        for (int i = 0; i < n; i++) {
            double v = x[i];
            double g = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
            ok &= close_to(out[i], g, 1e-5, 1e-6);
        }
        CHECK(ok);
        /* dot, axpy, softcap */
        double d = 0;
        for (int i = 0; i < n; i++) d += (double)x[i] * y[i];
        float df = 0;
        CHECK(cb_dot_f32(x, y, n, &df) == CB_OK);
        CHECK(close_to(df, d, 1e-5, 1e-4));
        memcpy(out, y, sizeof(float) * n);
        CHECK(cb_axpy(0.5f, x, n, out) == CB_OK);
        ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], y[i] + 0.5 * x[i], 1e-6, 1e-6);
        CHECK(ok);
        memcpy(out, x, sizeof(float) * n);
        CHECK(cb_softcap(out, n, 3.0f) == CB_OK);
        ok = 1;
        for (int i = 0; i < n; i++) ok &= close_to(out[i], 3.0 * tanh(x[i] / 3.0), 1e-5, 1e-6);
        CHECK(ok);
    }
    /* extremes: masked scores, huge activations */
    float s[11] = {-INFINITY, 1, -INFINITY, 1, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(cb_softmax(s, 11) == CB_OK);
    CHECK(s[0] == 0 && s[2] == 0 && fabsf(s[1] - 0.5f) < 1e-6f && fabsf(s[3] - 0.5f) < 1e-6f);
    for (int i = 0; i < 11; i++) s[i] = -INFINITY;
    CHECK(cb_softmax(s, 11) == CB_OK);
    int zeros = 1;
    for (int i = 0; i < 11; i++) zeros &= s[i] == 0.0f;
    CHECK(zeros);
    float big[9] = {-1000, -100, -88, 88, 89, 100, 1000, 1e30f, -1e30f};
    CHECK(cb_silu(big, 9, out) == CB_OK);
    CHECK(out[0] == 0 && out[1] == 0 && out[3] == 88 && out[6] == 1000 && out[7] == 1e30f);
    CHECK(out[8] == 0);
    CHECK(cb_gelu_tanh(big, 9, out) == CB_OK);
    CHECK(out[0] == 0 && out[6] == 1000 && out[8] == 0 && !isnan(out[7]));
    /* rope: pos 0 is identity; rotation keeps each pair's norm */
    float q[2 * 8], q0[2 * 8];
    for (int i = 0; i < 16; i++) q[i] = q0[i] = frand();
    cb_rope_params_t p = cb_rope_default_params();
    CHECK(cb_rope(q, 2, 8, 0, &p) == CB_OK);
    CHECK(memcmp(q, q0, sizeof q) == 0);
    p.mode = CB_ROPE_NEOX;
    p.n_dims = 6;
    CHECK(cb_rope(q, 2, 8, 12345, &p) == CB_OK);
    CHECK(q[6] == q0[6] && q[7] == q0[7] && q[14] == q0[14]); /* beyond n_dims: untouched */
    CHECK(close_to(hypot(q[0], q[3]), hypot(q0[0], q0[3]), 1e-5, 0));
    CHECK(close_to(hypot(q[9], q[12]), hypot(q0[9], q0[12]), 1e-5, 0));
}

/* cb_rope == cb_rope_cache + cb_rope_apply; cb_rope_batch honours token strides. */
static void check_rope_paths(void) {
    enum { NH = 3, HD = 16, NT = 4, TS = NH * HD + 5 };
    float x[NT * TS], y[NT * TS];
    for (int i = 0; i < NT * TS; i++) x[i] = y[i] = frand();
    cb_rope_params_t p = cb_rope_default_params();
    p.mode = CB_ROPE_NEOX;
    p.freq_scale = 0.5f;
    p.ext_factor = 1.0f;
    p.n_ctx_orig = 512;
    int64_t pos[NT] = {0, 3, 1000, 77};
    CHECK(cb_rope_batch(x, NT, TS, NH, HD, pos, &p) == CB_OK);
    int same = 1, pad_kept = 1;
    for (int t = 0; t < NT; t++) {
        float c[HD / 2], s[HD / 2];
        CHECK(cb_rope_cache(pos[t], HD, &p, c, s) == CB_OK);
        CHECK(cb_rope_apply(y + t * TS, NH, HD, HD, HD, p.mode, c, s) == CB_OK);
        for (int i = 0; i < NH * HD; i++) same &= x[t * TS + i] == y[t * TS + i];
        for (int i = NH * HD; i < TS; i++) pad_kept &= x[t * TS + i] == y[t * TS + i];
    }
    CHECK(same);
    CHECK(pad_kept);
    /* cb_rope_cache_batch == cb_rope_cache per position (with freq_factors too), rows at a
     * stride; a stride under n_dims/2 is refused */
    enum { RS = HD / 2 + 3 };
    float ff[HD / 2], cb[NT * RS], sb[NT * RS];
    for (int i = 0; i < HD / 2; i++) ff[i] = 1.0f + (float)i * 0.25f;
    int batch_same = 1;
    for (int with_ff = 0; with_ff < 2; with_ff++) {
        p.freq_factors = with_ff ? ff : NULL;
        CHECK(cb_rope_cache_batch(NT, pos, HD, &p, cb, sb, RS) == CB_OK);
        for (int t = 0; t < NT; t++) {
            float c[HD / 2], s[HD / 2];
            CHECK(cb_rope_cache(pos[t], HD, &p, c, s) == CB_OK);
            batch_same &= memcmp(c, cb + t * RS, sizeof c) == 0;
            batch_same &= memcmp(s, sb + t * RS, sizeof s) == 0;
        }
    }
    CHECK(batch_same);
    CHECK(cb_rope_cache_batch(NT, pos, HD, &p, cb, sb, HD / 2 - 1) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_rope_cache_batch(NT, NULL, HD, &p, cb, sb, RS) == CB_STATUS_INVALID_ARGUMENT);
    p.freq_factors = NULL;
    /* dot_rows == scale * dot per row */
    float q[HD], out[NT];
    for (int i = 0; i < HD; i++) q[i] = frand();
    CHECK(cb_dot_rows_f32(q, x, NT, TS, HD, 0.25f, out) == CB_OK);
    int ok = 1;
    for (int t = 0; t < NT; t++) {
        float d = 0;
        CHECK(cb_dot_f32(q, x + t * TS, HD, &d) == CB_OK);
        ok &= close_to(out[t], 0.25 * d, 1e-6, 1e-6);
    }
    CHECK(ok);
    /* the multi-head forms: bit-identical to one head at a time (dot_rows, then axpy row by
     * row), with padded strides; 3 heads over the NT rows of x */
    enum { NQ = 3, QS = HD + 5, OS = NT + 3 };
    float qm[NQ * QS], sm[NQ * OS], s1[NT], ym[NQ * QS], y1[HD];
    for (int i = 0; i < NQ * QS; i++) qm[i] = frand();
    for (int i = 0; i < NQ * OS; i++) sm[i] = -7.0f;
    CHECK(cb_dot_rows_multi_f32(qm, QS, NQ, x, NT, TS, HD, 0.125f, sm, OS) == CB_OK);
    for (int i = 0; i < NQ * QS; i++) ym[i] = 0.5f * frand();
    float ym0[NQ * QS];
    memcpy(ym0, ym, sizeof ym);
    CHECK(cb_axpy_rows_multi_f32(sm, OS, NQ, x, NT, TS, HD, ym, QS) == CB_OK);
    int same_dot = 1, same_v = 1, pad = 1;
    for (int h = 0; h < NQ; h++) {
        CHECK(cb_dot_rows_f32(qm + h * QS, x, NT, TS, HD, 0.125f, s1) == CB_OK);
        same_dot &= memcmp(s1, sm + h * OS, sizeof s1) == 0;
        for (int j = NT; j < OS; j++) pad &= sm[h * OS + j] == -7.0f;
        memcpy(y1, ym0 + h * QS, sizeof y1);
        for (int t = 0; t < NT; t++) CHECK(cb_axpy(sm[h * OS + t], x + t * TS, HD, y1) == CB_OK);
        same_v &= memcmp(y1, ym + h * QS, sizeof y1) == 0;
        for (int i = HD; i < QS; i++) pad &= ym[h * QS + i] == ym0[h * QS + i];
    }
    CHECK(same_dot);
    CHECK(same_v);
    CHECK(pad);
    CHECK(cb_dot_rows_multi_f32(qm, HD - 1, 2, x, NT, TS, HD, 1.0f, sm, OS) ==
          CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_dot_rows_multi_f32(qm, QS, 2, x, NT, TS, HD, 1.0f, sm, NT - 1) ==
          CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_axpy_rows_multi_f32(sm, OS, 2, x, NT, TS, HD, ym, HD - 1) ==
          CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_axpy_rows_multi_f32(sm, OS, -1, x, NT, TS, HD, ym, QS) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_axpy_rows_multi_f32(NULL, OS, 2, x, NT, TS, HD, ym, QS) == CB_STATUS_INVALID_ARGUMENT);
}

/* Attention's multi-head score and value sums at head sizes with and without the 8-row / register
 * paths (multiples of 32 / 8) and row counts around the 8-row blocks: every score bit-equal to
 * scale * cb_dot_f32 of its row, every value sum bit-equal to cb_axpy row by row, padding kept. */
static void check_attention_rows(void) {
    const int hds[] = {32, 64, 80, 128, 256, 24};
    enum { MAXR = 41, NQ = 3 };
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
        const int hd = hds[a], ks = NQ * hd + 4, qs = hd + 3, os = MAXR + 2;
        float *k = malloc(sizeof(float) * (size_t)(MAXR * ks)), *q = malloc(sizeof(float) * (size_t)(NQ * qs));
        float *sc = malloc(sizeof(float) * (size_t)(NQ * os)), *y = malloc(sizeof(float) * (size_t)(NQ * qs));
        float *y1 = malloc(sizeof(float) * (size_t)hd), *y0 = malloc(sizeof(float) * (size_t)(NQ * qs));
        for (int i = 0; i < MAXR * ks; i++) k[i] = frand();
        for (int i = 0; i < NQ * qs; i++) q[i] = frand();
        const int rows[] = {1, 7, 8, 9, 16, 23, MAXR};
        int same_s = 1, same_v = 1, pad = 1;
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            const int n = rows[r];
            for (int i = 0; i < NQ * os; i++) sc[i] = -7.0f;
            CHECK(cb_dot_rows_multi_f32(q, qs, NQ, k, n, ks, hd, 0.0883f, sc, os) == CB_OK);
            for (int h = 0; h < NQ; h++) {
                for (int j = 0; j < n; j++) {
                    float d = 0;
                    CHECK(cb_dot_f32(q + h * qs, k + j * ks, hd, &d) == CB_OK);
                    float want = 0.0883f * d;
                    same_s &= memcmp(&want, sc + h * os + j, 4) == 0;
                }
                for (int j = n; j < os; j++) pad &= sc[h * os + j] == -7.0f;
            }
            for (int i = 0; i < NQ * qs; i++) y[i] = y0[i] = 0.25f * frand();
            CHECK(cb_axpy_rows_multi_f32(sc, os, NQ, k + hd, n, ks, hd, y, qs) == CB_OK);
            for (int h = 0; h < NQ; h++) {
                memcpy(y1, y0 + h * qs, sizeof(float) * (size_t)hd);
                for (int j = 0; j < n; j++) CHECK(cb_axpy(sc[h * os + j], k + hd + j * ks, hd, y1) == CB_OK);
                same_v &= memcmp(y1, y + h * qs, sizeof(float) * (size_t)hd) == 0;
                for (int i = hd; i < qs; i++) pad &= y[h * qs + i] == y0[h * qs + i];
            }
        }
        if (!same_s || !same_v) fprintf(stderr, "attention rows, head size %d: scores %d values %d\n", hd, same_s, same_v);
        CHECK(same_s);
        CHECK(same_v);
        CHECK(pad);
        free(k);
        free(q);
        free(sc);
        free(y);
        free(y1);
        free(y0);
    }
}

/* The f16 K/V kernels equal the f32 ones on the rows widened to floats, bit for bit: head
 * sizes 24-256, 0-300 rows (across the widening chunks: 16 rows at 256, 168 at 24), padded
 * strides, values of every f16 magnitude incl. subnormals; and they refuse bad shapes. */
static void check_attention_rows_f16(void) {
    const int hds[] = {24, 64, 128, 256};
    enum { MAXR = 300, NQ = 4 };
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++) {
        const int hd = hds[a], ks = 2 * hd + 6, qs = hd + 3, os = MAXR + 2;
        uint16_t *k16 = malloc(sizeof(uint16_t) * (size_t)(MAXR * ks));
        float *kf = malloc(sizeof(float) * (size_t)(MAXR * ks)), *q = malloc(sizeof(float) * (size_t)(NQ * qs));
        float *s16 = malloc(sizeof(float) * (size_t)(NQ * os)), *s32 = malloc(sizeof(float) * (size_t)(NQ * os));
        float *y16 = malloc(sizeof(float) * (size_t)(NQ * qs)), *y32 = malloc(sizeof(float) * (size_t)(NQ * qs));
        for (int i = 0; i < MAXR * ks; i++) {
            float v = frand();
            if (i % 97 == 5) v *= 1e-6f; /* an f16 subnormal */
            k16[i] = cb_f32_to_f16(v);
            kf[i] = cb_f16_to_f32(k16[i]);
        }
        for (int i = 0; i < NQ * qs; i++) q[i] = frand();
        const int rows[] = {0, 1, 7, 17, 168, 169, MAXR};
        int same = 1;
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            const int n = rows[r];
            for (int i = 0; i < NQ * os; i++) s16[i] = s32[i] = -7.0f;
            CHECK(cb_dot_rows_multi_f16(q, qs, NQ, k16, n, ks, hd, 0.0625f, s16, os) == CB_OK);
            CHECK(cb_dot_rows_multi_f32(q, qs, NQ, kf, n, ks, hd, 0.0625f, s32, os) == CB_OK);
            same &= memcmp(s16, s32, sizeof(float) * (size_t)(NQ * os)) == 0;
            for (int i = 0; i < NQ * os; i++) s32[i] = s16[i] = 0.01f * frand();
            for (int i = 0; i < NQ * qs; i++) y16[i] = y32[i] = 0.25f * frand();
            CHECK(cb_axpy_rows_multi_f16(s16, os, NQ, k16 + hd, n, ks, hd, y16, qs) == CB_OK);
            CHECK(cb_axpy_rows_multi_f32(s32, os, NQ, kf + hd, n, ks, hd, y32, qs) == CB_OK);
            same &= memcmp(y16, y32, sizeof(float) * (size_t)(NQ * qs)) == 0;
        }
        if (!same) fprintf(stderr, "f16 attention rows, head size %d: not the f32 results\n", hd);
        CHECK(same);
        free(k16);
        free(kf);
        free(q);
        free(s16);
        free(s32);
        free(y16);
        free(y32);
    }
    uint16_t h[8] = {0};
    float f[8] = {0}, o[8];
    CHECK(cb_dot_rows_multi_f16(f, 4, 1, h, 2, 1, 4, 1.0f, o, 2) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_dot_rows_multi_f16(f, 8192, 1, h, 1, 8192, 8192, 1.0f, o, 1) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_axpy_rows_multi_f16(f, 2, 1, NULL, 2, 4, 4, o, 4) == CB_STATUS_INVALID_ARGUMENT);
    o[0] = o[1] = 5.0f; /* empty rows: zero scores, K not read */
    CHECK(cb_dot_rows_multi_f16(f, 0, 1, NULL, 2, 0, 0, 1.0f, o, 2) == CB_OK && o[0] == 0.0f && o[1] == 0.0f);
}

/* cb_f32_to_f16_n and cb_f16_round (F16C under AVX2) give cb_f32_to_f16's bits: every f16 value,
 * the midpoints between neighbours (ties to even), f32 subnormals, overflow to infinity, and
 * random bit patterns; lengths with a tail. A NaN only needs to stay a NaN. */
static int f16_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0; }

static void check_f16_conversions(void) {
    enum { N = 65536 * 2 + 4099 };
    static float x[N], r[N];
    static uint16_t h[N];
    size_t n = 0;
    for (uint32_t v = 0; v < 65536; v++) {
        float a = cb_f16_to_f32((uint16_t)v), b = cb_f16_to_f32((uint16_t)(v + 1));
        x[n++] = a;
        if ((v & 0x7C00u) != 0x7C00u && ((v + 1) & 0x7C00u) != 0x7C00u && (v & 0x7FFFu) != 0x7FFFu)
            x[n++] = (float)(((double)a + (double)b) / 2); /* the tie between neighbours */
    }
    uint32_t seed = 12345u;
    while (n < N) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t bits = seed;
        memcpy(&x[n++], &bits, 4);
    }
    const float edge[] = {65504.0f, 65519.99f, 65520.0f, 1e-45f, -1e-40f, 5.9604645e-8f, 2.9802322e-8f,
                          INFINITY, -INFINITY, NAN};
    memcpy(x, edge, sizeof edge);
    int bad = 0;
    for (size_t len = N; len + 3 >= N; len--) { /* tails of 0..3 past a multiple of 8 */
        memcpy(r, x, len * sizeof(float));
        cb_f32_to_f16_n(x, (int64_t)len, h);
        cb_f16_round(r, (int64_t)len);
        for (size_t i = 0; i < len; i++) {
            uint16_t want = cb_f32_to_f16(x[i]);
            float wr = cb_f16_to_f32(want);
            if (f16_is_nan(want)) {
                bad += !f16_is_nan(h[i]) || r[i] == r[i];
            } else {
                uint32_t a, b;
                memcpy(&a, &r[i], 4);
                memcpy(&b, &wr, 4);
                bad += h[i] != want || a != b;
            }
        }
    }
    if (bad) fprintf(stderr, "f16 conversions: %d values differ from cb_f32_to_f16\n", bad);
    CHECK(bad == 0);
}

int main(void) {
    check_rope_paths();
    check_attention_rows();
    check_attention_rows_f16();
    check_f16_conversions();
    cb_simd_level best = cb_cpu_detect();
    cb_cpu_set_max_level(CB_SIMD_SCALAR);
    check_attention_rows_f16();
    check_f16_conversions();
    cb_cpu_set_max_level(CB_SIMD_AVX512_VNNI);
    check_level(CB_SIMD_SCALAR);
    if (best >= CB_SIMD_AVX2) check_level(CB_SIMD_AVX2);
    cb_cpu_set_max_level(CB_SIMD_AVX512_VNNI);

    /* argument errors */
    float x[4] = {1, 2, 3, 4}, o[4];
    CHECK(cb_rmsnorm(NULL, NULL, 4, 1e-6f, 0, o) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_rmsnorm(x, NULL, -1, 1e-6f, 0, o) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_rmsnorm(x, NULL, 4, -1.0f, 0, o) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_rmsnorm_rows(x, 1, 2, 2, NULL, 1e-6f, 0, o, 2) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_layernorm_rows(x, 1, 2, 2, NULL, NULL, 1e-6f, o, 2) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_layernorm_rows(NULL, 4, 1, 4, NULL, NULL, 1e-6f, o, 4) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_layernorm_rows(x, 4, 1, 4, NULL, NULL, NAN, o, 4) == CB_STATUS_INVALID_ARGUMENT);
    {   /* LayerNorm: two rows of 4 with weight and bias, against the double formula */
        const float lx[8] = {1, 2, 3, 4, -2, 0.5f, 7, 1e3f}, lw[4] = {1, -2, 0.5f, 3},
                    lb[4] = {0.1f, 0, -1, 2};
        float lo[8];
        CHECK(cb_layernorm_rows(lx, 4, 2, 4, lw, lb, 1e-5f, lo, 4) == CB_OK);
        for (int r = 0; r < 2; r++) {
            double mu = 0, var = 0;
            for (int i = 0; i < 4; i++) mu += lx[4 * r + i] / 4.0;
            for (int i = 0; i < 4; i++) var += (lx[4 * r + i] - mu) * (lx[4 * r + i] - mu) / 4.0;
            for (int i = 0; i < 4; i++) {
                double want = (lx[4 * r + i] - mu) / sqrt(var + 1e-5) * lw[i] + lb[i];
                CHECK(fabs(lo[4 * r + i] - want) <= 1e-6 * (1 + fabs(want)));
            }
        }
        CHECK(cb_layernorm_rows(lx, 4, 1, 4, NULL, NULL, 0.0f, lo, 4) == CB_OK); /* no affine */
        CHECK(fabs(lo[0] + lo[1] + lo[2] + lo[3]) < 1e-6 && fabs(lo[0] + 1.3416408) < 1e-6);
    }
    CHECK(cb_softmax(NULL, 3) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_softmax(NULL, 0) == CB_OK);
    CHECK(cb_softcap(x, 4, 0.0f) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_glu((cb_act)7, x, x, 4, o) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_dot_f32(x, x, 4, NULL) == CB_STATUS_INVALID_ARGUMENT);
    CHECK(cb_dot_rows_f32(x, x, 2, 1, 2, 1.0f, o) == CB_STATUS_INVALID_ARGUMENT);
    cb_rope_params_t p = cb_rope_default_params();
    CHECK(cb_rope(x, 1, 4, 3, NULL) == CB_STATUS_INVALID_ARGUMENT);
    p.n_dims = 3;
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_STATUS_INVALID_ARGUMENT);
    p.n_dims = 6;
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_STATUS_INVALID_ARGUMENT);
    p.n_dims = 0;
    p.mode = (cb_rope_mode)1;
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_STATUS_INVALID_ARGUMENT);
    p.mode = CB_ROPE_NORMAL;
    p.freq_base = 0.0f;
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_STATUS_INVALID_ARGUMENT);
    p.freq_base = 10000.0f;
    p.ext_factor = 1.0f; /* YaRN without n_ctx_orig */
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_STATUS_INVALID_ARGUMENT);
    p.n_ctx_orig = 4096;
    CHECK(cb_rope(x, 1, 4, 3, &p) == CB_OK);
    CHECK(cb_rope(x, 1, 4096, 3, &p) == CB_STATUS_INVALID_ARGUMENT); /* > CB_ROPE_MAX_DIMS */
    TEST_MAIN_END("test_ops");
}
