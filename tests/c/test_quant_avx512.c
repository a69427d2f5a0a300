/* The AVX-512 kernels (colibri/_core/quant_avx512.c and, for the K-quants, quant_avx512_k.c)
 * against the scalar reference kernels, on any x86-64 CPU: this file compiles the very same
 * sources again with CB_AVX512_EMULATE, i.e. on SIMDe's portable implementations of the
 * AVX-512 intrinsics, under the names cb_avx512emu_*
 * (the native copy, cb_avx512_*, is linked beside it and is checked the same way when the CPU
 * has AVX-512). Checked, for every block type, on random shapes (odd block counts, float rows
 * with tails, 1..4 rows and tokens per tile, 1..8 rows per packed group, 1..4 tokens):
 *   - the activation quantizers (q8a, q8k, the packed-row layout): the same bytes as the scalar
 *     quantizer (incl. zero blocks and rounding ties);
 *   - the matvec tiles and the packed-row matmul tile: "exact" data (power-of-two scales, integer
 *     activations with d = 1, sums far below 2^24) where every path computes the same number,
 *     so results must be equal bit for bit (the integer block sums are the scalar ones); and
 *     random data, where they must agree within 2e-5 of sum|w*x| (float summation order).
 * Without AVX2 (needed for cb_avx2_rp_pack, the packing the AVX-512 matmul tile reads) the
 * packed-row part cannot run and says so. */
#define CB_AVX512_EMULATE 1
#include "quant_avx512.c"
#include "quant_avx512_k.c"
#include "quant_avx512_pack.c"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "colibri/cpu.h"
#include "testutil.h"

typedef struct {
    const char *name;
    cb_tile_fn (*tile)(int type);
    void (*q8a)(const float *x, int64_t n, void *dst);
    void (*q8k)(const float *x, int64_t n, void *dst);
    void (*rp_quantize)(int type, const float *x, int64_t cols, uint8_t *dst);
    void (*rp_tile)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa, size_t xs, int nt,
                    float *out);
} kernels;

static const kernels EMULATED = {"emulated", cb_avx512emu_tile, cb_avx512emu_quantize_q8a,
                                 cb_avx512emu_quantize_q8k, cb_avx512emu_rp_quantize,
                                 cb_avx512emu_rp_tile};
static const kernels NATIVE = {"native", cb_avx512_tile, cb_avx512_quantize_q8a,
                               cb_avx512_quantize_q8k, cb_avx512_rp_quantize, cb_avx512_rp_tile};
/* the AVX512-VNNI packed tile (the other kernels as above) */
static const kernels EMULATED_VNNI = {"emulated vnni", cb_avx512emu_tile, cb_avx512emu_quantize_q8a,
                                      cb_avx512emu_quantize_q8k, cb_avx512emu_rp_quantize,
                                      cb_avx512emu_rp_tile_vnni};
static const kernels NATIVE_VNNI = {"native vnni", cb_avx512_tile, cb_avx512_quantize_q8a,
                                    cb_avx512_quantize_q8k, cb_avx512_rp_quantize,
                                    cb_avx512_rp_tile_vnni};

static const int TYPES[] = {CB_TYPE_F32,   CB_TYPE_F16,  CB_TYPE_BF16, CB_TYPE_Q4_0, CB_TYPE_Q4_1,
                            CB_TYPE_Q5_0,  CB_TYPE_Q5_1, CB_TYPE_Q8_0, CB_TYPE_MXFP4,
                            CB_TYPE_Q4_K,  CB_TYPE_Q5_K, CB_TYPE_Q6_K, CB_TYPE_I4_G128};
#define N_TYPES ((int)(sizeof TYPES / sizeof TYPES[0]))

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }
static int rndi(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); } /* [lo, hi] */

static int kind_of(int type) { /* 0: float activations, 1: q8a, 2: q8k */
    int64_t bs = cb_type_block_size(type);
    return bs == 1 ? 0 : (bs == 256 ? 2 : 1);
}

static void put16(uint8_t *p, float f) {
    uint16_t h = cb_f32_to_f16(f);
    memcpy(p, &h, 2);
}

static float pow2(int lo, int hi) { return ldexpf(1.0f, rndi(lo, hi)); }

/* Random valid weight bytes. exact: power-of-two scales (and offsets), small Q6_K scales and
 * float weights on a 1/4 grid, so that every product and partial sum is exact in float. */
static void fill_weights(int type, uint8_t *raw, size_t bytes, int exact) {
    for (size_t i = 0; i < bytes; i++) raw[i] = (uint8_t)rnd();
    size_t bb = cb_type_block_bytes(type);
    for (size_t b = 0; b < bytes / bb; b++) {
        uint8_t *p = raw + b * bb;
        float d = exact ? pow2(-1, 0) : 0.01f + 0.02f * (float)(rnd() % 100) / 100.0f;
        float m = exact ? (rnd() & 1 ? -1.0f : 1.0f) * pow2(-1, 0) : -0.005f + 0.01f * rndf();
        float v = exact ? 0.25f * (float)rndi(-64, 64) : rndf();
        switch (type) {
        case CB_TYPE_F32: memcpy(p, &v, 4); break;
        case CB_TYPE_F16: put16(p, v); break;
        case CB_TYPE_BF16: {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(p, &h, 2);
            break;
        }
        case CB_TYPE_Q4_1: case CB_TYPE_Q5_1:
            put16(p, d);
            put16(p + 2, m);
            break;
        case CB_TYPE_Q4_K: case CB_TYPE_Q5_K:
            put16(p, d);
            put16(p + 2, exact ? pow2(-1, 0) : 0.005f);
            break;
        case CB_TYPE_Q6_K:
            put16(p + 208, d);
            if (exact)
                for (int g = 0; g < 16; g++) p[192 + g] = (uint8_t)(int8_t)rndi(-32, 31);
            break;
        case CB_TYPE_MXFP4: p[0] = (uint8_t)(exact ? rndi(126, 128) : rndi(118, 127)); break;
        default: put16(p, d); break;
        }
    }
}

/* Activations: exact: small integers with one +-127 per activation block (so d = 1, q = x);
 * float weights: integers in [-8, 8]. Random: uniform in [-3, 3]. */
static void fill_x(int type, float *x, int64_t n, int exact) {
    int kind = kind_of(type);
    for (int64_t i = 0; i < n; i++)
        x[i] = exact ? (float)(kind ? rndi(-4, 4) : rndi(-8, 8)) : 3.0f * rndf();
    if (exact && kind) {
        int ab = kind == 2 ? CB_QKK : CB_QK;
        for (int64_t b = 0; b < n / ab; b++) x[b * ab + rndi(0, ab - 1)] = rnd() & 1 ? 127.0f : -127.0f;
    }
}

/* sum_c |W[r,c] * x_c| (dequantized activations) for the tolerance of random data */
static double magnitude(int type, const float *wrow, const uint8_t *xa, const float *xf, int64_t cols) {
    double mag = 0.0;
    int kind = kind_of(type);
    for (int64_t c = 0; c < cols; c++) {
        double xv;
        if (kind == 0) {
            xv = xf[c];
        } else if (kind == 1) {
            const cb_q8a_t *a = (const cb_q8a_t *)(const void *)xa + c / CB_QK;
            xv = (double)a->d * a->qs[c % CB_QK];
        } else {
            const cb_q8k_t *a = (const cb_q8k_t *)(const void *)xa + c / CB_QKK;
            xv = (double)a->d * a->qs[c % CB_QKK];
        }
        mag += fabs((double)wrow[c] * xv);
    }
    return mag;
}

static int close_enough(float got, float ref, double mag, int exact) {
    if (exact) return memcmp(&got, &ref, sizeof got) == 0;
    return fabs((double)got - (double)ref) <= 2e-5 * mag + 1e-30;
}

/* activation bytes of one row of `cols` values, quantized by the scalar kernel and by k */
static size_t act_stride(int type, int64_t cols) {
    int kind = kind_of(type);
    return kind == 0 ? (size_t)cols * 4
                     : (kind == 1 ? (size_t)(cols / CB_QK) * sizeof(cb_q8a_t)
                                  : (size_t)(cols / CB_QKK) * sizeof(cb_q8k_t));
}

static int quantize_both(const kernels *k, int type, const float *x, int64_t cols, uint8_t *mine,
                         uint8_t *ref) {
    int kind = kind_of(type);
    size_t bytes = act_stride(type, cols);
    if (kind == 0) {
        memcpy(mine, x, bytes);
        memcpy(ref, x, bytes);
        return 1;
    }
    (kind == 1 ? k->q8a : k->q8k)(x, cols, mine);
    (kind == 1 ? cb_scalar_quantize_q8a : cb_scalar_quantize_q8k)(x, cols, ref);
    return memcmp(mine, ref, bytes) == 0;
}

static int64_t random_cols(int type) {
    switch (kind_of(type)) {
    case 0: return rndi(1, 80);
    case 2: return (int64_t)CB_QKK * rndi(1, 3);
    default: return type == CB_TYPE_I4_G128 ? 128 * rndi(1, 3) : CB_QK * rndi(1, 7);
    }
}

/* the matvec/small-batch tile: nr <= 4 rows x nt <= 4 tokens (one token: nr <= 8) */
static int check_tile(const kernels *k, int type, int exact) {
    int64_t cols = random_cols(type);
    int nt = rndi(1, CB_TILE_T), nr = rndi(1, nt == 1 ? CB_TILE_R1 : CB_TILE_R);
    size_t rb;
    if (cb_type_row_bytes(type, cols, &rb) != CB_OK) return 0;
    size_t ws = rb + (size_t)rndi(0, 3) * 7; /* row strides beyond the row */
    size_t xs = act_stride(type, cols);
    int64_t n = kind_of(type) == 0 ? cols : (kind_of(type) == 1 ? cols / CB_QK : cols / CB_QKK);
    uint8_t *w = malloc(ws * (size_t)nr);
    float *wf = malloc(sizeof(float) * (size_t)(cols * nr));
    float *x = malloc(sizeof(float) * (size_t)(cols * nt));
    uint8_t *xa = malloc(xs * (size_t)nt), *xr = malloc(xs * (size_t)nt);
    float out[CB_TILE_OUT];
    int ok = 1;
    for (int r = 0; r < nr; r++) {
        fill_weights(type, w + (size_t)r * ws, ws, exact); /* padding past rb: random bytes */
        fill_weights(type, w + (size_t)r * ws, rb, exact);
    }
    for (int r = 0; r < nr; r++)
        if (cb_dequantize_rows(type, w + (size_t)r * ws, cols, wf + r * cols) != CB_OK) ok = 0;
    fill_x(type, x, cols * nt, exact);
    for (int t = 0; t < nt; t++)
        if (!quantize_both(k, type, x + t * cols, cols, xa + (size_t)t * xs, xr + (size_t)t * xs)) {
            fprintf(stderr, "%s %s: activation quantizer differs from the scalar one\n", k->name,
                    cb_type_name(type));
            ok = 0;
        }
    cb_tile_fn tile = k->tile(type);
    cb_dot_fn dot = cb_scalar_dot(type);
    if (!tile || !dot) ok = 0;
    if (ok) {
        tile(n, w, ws, nr, xa, xs, nt, out);
        for (int r = 0; r < nr; r++)
            for (int t = 0; t < nt; t++) {
                float ref = dot(n, w + (size_t)r * ws, xr + (size_t)t * xs);
                double mag = magnitude(type, wf + r * cols, xr + (size_t)t * xs, x + t * cols, cols);
                if (!close_enough(out[r * nt + t], ref, mag, exact)) {
                    if (ok)
                        fprintf(stderr,
                                "%s tile %s %s cols=%lld nr=%d nt=%d: [%d,%d] = %.9g, scalar %.9g "
                                "(sum|wx| %g)\n",
                                k->name, cb_type_name(type), exact ? "exact" : "random",
                                (long long)cols, nr, nt, r, t, (double)out[r * nt + t], (double)ref,
                                mag);
                    ok = 0;
                }
            }
    }
    free(w);
    free(wf);
    free(x);
    free(xa);
    free(xr);
    return ok;
}

static void *aligned(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, (bytes + 63) / 64 * 64 + 64) != 0) return NULL;
    return p;
}

/* The packed-row layout built from the scalar q8a quantizer (see cb_avx2_rp_quantize). */
static void rp_expected(int type, const float *x, int64_t cols, uint8_t *dst, uint8_t *q8) {
    int64_t nb = cols / CB_QK;
    cb_scalar_quantize_q8a(x, cols, q8);
    const cb_q8a_t *a = (const cb_q8a_t *)(const void *)q8;
    int z = type == CB_TYPE_Q4_0 || type == CB_TYPE_I4_G128 ? 8
            : type == CB_TYPE_Q5_0                          ? 16
            : type == CB_TYPE_MXFP4                         ? 12
            : type == CB_TYPE_Q8_0                          ? 128 /* the VNNI tile's w + 128 */
                                                            : 0;
    for (int64_t b = 0; b < nb; b++) {
        memcpy(dst + 32 * b, a[b].qs, 32);
        int32_t zi = z * a[b].isum;
        memcpy(dst + cols + 4 * b, &a[b].d, 4);
        memcpy(dst + cols + 4 * nb + 4 * b, &zi, 4);
        memcpy(dst + cols + 8 * nb + 4 * b, &a[b].s, 4);
    }
}

/* the packed-row matmul tile: nr <= 8 rows packed by cb_avx2_rp_pack, nt <= 4 tokens */
static int check_rp(const kernels *k, int type, int exact) {
    int64_t cols = random_cols(type);
    int nr = rndi(1, 8), nt = rndi(1, 4);
    int kq = kind_of(type) == 2;
    size_t rb;
    if (cb_type_row_bytes(type, cols, &rb) != CB_OK) return 0;
    size_t ws = rb + (size_t)rndi(0, 2) * 5;
    size_t xs = kq ? act_stride(type, cols) : cb_avx2_rp_act_stride(cols);
    size_t rs = act_stride(type, cols); /* scalar activations (q8a / q8k) */
    int64_t nb = kq ? cols / CB_QKK : cols / CB_QK;
    uint8_t *w = malloc(ws * (size_t)nr);
    float *wf = malloc(sizeof(float) * (size_t)(cols * nr));
    float *x = malloc(sizeof(float) * (size_t)(cols * nt));
    uint8_t *pk = aligned(cb_avx2_rp_group_bytes(type, cols));
    uint8_t *xa = aligned(xs * (size_t)nt), *xe = aligned(xs * (size_t)nt);
    uint8_t *xr = malloc(rs * (size_t)nt);
    float out[8 * 4];
    int ok = pk && xa && xe;
    for (int r = 0; r < nr; r++) {
        fill_weights(type, w + (size_t)r * ws, ws, exact); /* padding past rb: random bytes */
        fill_weights(type, w + (size_t)r * ws, rb, exact);
    }
    for (int r = 0; r < nr; r++)
        if (cb_dequantize_rows(type, w + (size_t)r * ws, cols, wf + r * cols) != CB_OK) ok = 0;
    fill_x(type, x, cols * nt, exact);
    for (int t = 0; ok && t < nt; t++) {
        if (kq) {
            ok &= quantize_both(k, type, x + t * cols, cols, xa + (size_t)t * xs, xr + (size_t)t * rs);
        } else {
            k->rp_quantize(type, x + t * cols, cols, xa + (size_t)t * xs);
            rp_expected(type, x + t * cols, cols, xe + (size_t)t * xs, xr + (size_t)t * rs);
            ok &= memcmp(xa + (size_t)t * xs, xe + (size_t)t * xs, (size_t)(cols + 12 * nb)) == 0;
        }
        if (!ok)
            fprintf(stderr, "%s %s: packed-row activations differ from the scalar quantizer's\n",
                    k->name, cb_type_name(type));
    }
    if (ok) {
        cb_avx2_rp_pack(type, w, ws, nr, cols, pk);
        for (int i = 0; i < 8 * 4; i++) out[i] = -1.0f;
        k->rp_tile(type, pk, kq ? nb : cols / CB_QK, xa, xs, nt, out);
        cb_dot_fn dot = cb_scalar_dot(type);
        int64_t n = cols / (kq ? CB_QKK : CB_QK);
        for (int r = 0; r < 8; r++)
            for (int t = 0; t < nt; t++) {
                float got = out[r * nt + t];
                float ref = r < nr ? dot(n, w + (size_t)r * ws, xr + (size_t)t * rs) : 0.0f;
                double mag = r < nr ? magnitude(type, wf + r * cols, xr + (size_t)t * rs, NULL, cols)
                                    : 0.0;
                if (!(r < nr ? close_enough(got, ref, mag, exact) : got == 0.0f)) {
                    if (ok)
                        fprintf(stderr,
                                "%s packed rows %s %s cols=%lld nr=%d nt=%d: [%d,%d] = %.9g, "
                                "scalar %.9g (sum|wx| %g)\n",
                                k->name, cb_type_name(type), exact ? "exact" : "random",
                                (long long)cols, nr, nt, r, t, (double)got, (double)ref, mag);
                    ok = 0;
                }
            }
    }
    free(w);
    free(wf);
    free(x);
    free(pk);
    free(xa);
    free(xe);
    free(xr);
    return ok;
}

/* Two packed tiles (AVX-512 with and without VNNI) on the same random groups, every packed type
 * (32-blocks and K-quants): bit-equal outputs
 * (the same integer block sums, then the same float operations; batch invariance relies on it).
 * Extreme weights too: all Q8_0 bytes -128 or 127 against activations +-127. */
static void check_rp_same(const kernels *a, const kernels *b) {
    for (int i = 0; i < N_TYPES; i++) {
        int type = TYPES[i];
        if (!cb_avx2_rp_supported(type)) continue;
        const int kq = kind_of(type) == 2;
        int ok = 1;
        for (int rep = 0; rep < 60 && ok; rep++) {
            int64_t cols = random_cols(type), nb = cols / (kq ? CB_QKK : CB_QK);
            int nr = rndi(1, 8), nt = rndi(1, 4);
            size_t rb;
            CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
            size_t xs = kq ? act_stride(type, cols) : cb_avx2_rp_act_stride(cols);
            uint8_t *w = malloc(rb * 8), *pk = aligned(cb_avx2_rp_group_bytes(type, cols));
            uint8_t *xa = aligned(xs * 4);
            float *x = malloc(sizeof(float) * (size_t)(cols * 4));
            float oa[32], ob[32];
            for (int r = 0; r < nr; r++) fill_weights(type, w + (size_t)r * rb, rb, 0);
            if (type == CB_TYPE_Q8_0 && (rep & 1))
                for (int r = 0; r < nr; r++)
                    for (int64_t k = 0; k < nb; k++)
                        memset(w + (size_t)r * rb + (size_t)k * 34 + 2, (rep & 2) ? 0x80 : 0x7f, 32);
            for (int64_t j = 0; j < cols * nt; j++)
                x[j] = (rep & 1) ? ((j & 1) ? 1.0f : -1.0f) : 4.0f * rndf();
            for (int t = 0; t < nt; t++) {
                if (kq) a->q8k(x + t * cols, cols, xa + (size_t)t * xs);
                else a->rp_quantize(type, x + t * cols, cols, xa + (size_t)t * xs);
            }
            cb_avx2_rp_pack(type, w, rb, nr, cols, pk);
            a->rp_tile(type, pk, nb, xa, xs, nt, oa);
            b->rp_tile(type, pk, nb, xa, xs, nt, ob);
            if (memcmp(oa, ob, sizeof(float) * 8 * (size_t)nt) != 0) {
                fprintf(stderr, "%s vs %s %s cols=%lld nr=%d nt=%d: packed tiles differ\n", a->name,
                        b->name, cb_type_name(type), (long long)cols, nr, nt);
                ok = 0;
            }
            free(w);
            free(pk);
            free(xa);
            free(x);
        }
        CHECK(ok);
    }
}

/* The 16-row VNNI tile (cb_avx2_rp16_pack groups) against the 8-row VNNI tile on the same rows
 * (two 8-row groups), every packed type, 1..16 rows, 1..8 tokens (K-quants 1..4): bit-equal
 * outputs, and 0 for the rows past nr. Extreme weights too (all Q8_0 bytes -128 or 127,
 * activations +-127). */
typedef void (*rp16_tile_fn)(int type, const uint8_t *pk, int64_t nb, const uint8_t *xa,
                             size_t xs, int nt, float *out);
static void check_rp16(const kernels *k8, rp16_tile_fn tile16, const char *name) {
    for (int i = 0; i < N_TYPES; i++) {
        int type = TYPES[i];
        if (!cb_avx2_rp_supported(type)) continue;
        const int kq = kind_of(type) == 2;
        int ok = 1;
        for (int rep = 0; rep < 60 && ok; rep++) {
            int64_t cols = random_cols(type), nb = cols / (kq ? CB_QKK : CB_QK);
            int nr = rndi(1, 16), nt = rndi(1, kq ? 4 : 8);
            size_t rb;
            CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
            size_t ws = rb + (size_t)rndi(0, 2) * 7;
            size_t xs = kq ? act_stride(type, cols) : cb_avx2_rp_act_stride(cols);
            uint8_t *w = malloc(ws * 16), *xa = aligned(xs * 8);
            uint8_t *pk16 = aligned(cb_avx2_rp16_group_bytes(type, cols));
            uint8_t *pk8 = aligned(cb_avx2_rp_group_bytes(type, cols));
            float *x = malloc(sizeof(float) * (size_t)(cols * 8));
            float o16[16 * 8], o8[8 * 4];
            for (int r = 0; r < 16; r++) fill_weights(type, w + (size_t)r * ws, ws, 0);
            if (type == CB_TYPE_Q8_0 && (rep & 1))
                for (int r = 0; r < 16; r++)
                    for (int64_t k = 0; k < nb; k++)
                        memset(w + (size_t)r * ws + (size_t)k * 34 + 2, (rep & 2) ? 0x80 : 0x7f, 32);
            for (int64_t j = 0; j < cols * nt; j++)
                x[j] = (rep & 1) ? ((j & 1) ? 127.0f : -127.0f) : 4.0f * rndf();
            for (int t = 0; t < nt; t++) {
                if (kq) k8->q8k(x + t * cols, cols, xa + (size_t)t * xs);
                else k8->rp_quantize(type, x + t * cols, cols, xa + (size_t)t * xs);
            }
            cb_avx2_rp16_pack(type, w, ws, nr, cols, pk16);
            for (int j = 0; j < 16 * 8; j++) o16[j] = -1.0f;
            tile16(type, pk16, nb, xa, xs, nt, o16);
            for (int h = 0; h < 2 && ok; h++) {
                int nr8 = nr - 8 * h < 0 ? 0 : (nr - 8 * h > 8 ? 8 : nr - 8 * h);
                for (int t0 = 0; t0 < nt && ok; t0 += 4) {
                    int nt8 = nt - t0 < 4 ? nt - t0 : 4;
                    if (nr8 > 0) {
                        cb_avx2_rp_pack(type, w + (size_t)(8 * h) * ws, ws, nr8, cols, pk8);
                        k8->rp_tile(type, pk8, nb, xa + (size_t)t0 * xs, xs, nt8, o8);
                    }
                    for (int r = 0; r < 8; r++)
                        for (int t = 0; t < nt8; t++) {
                            float want = r < nr8 ? o8[r * nt8 + t] : 0.0f;
                            float got = o16[(8 * h + r) * nt + t0 + t];
                            if (memcmp(&want, &got, 4) != 0) {
                                fprintf(stderr, "%s %s cols=%lld nr=%d nt=%d: [%d,%d] = %.9g, "
                                        "8-row tile %.9g\n", name, cb_type_name(type),
                                        (long long)cols, nr, nt, 8 * h + r, t0 + t, (double)got,
                                        (double)want);
                                ok = 0;
                            }
                        }
                }
            }
            free(w);
            free(xa);
            free(pk16);
            free(pk8);
            free(x);
        }
        CHECK(ok);
    }
}

/* The batch-invariant direct tiles (CB_AVX512_FN(tile_invariant): the K-quants',
 * quant_avx512_k.c, and with VNNI the 32-block types', quant_avx512.c's tile32i): on random
 * data (where a different float order shows) every (row, token) is bit-equal to the AVX2
 * invariant tile's, at 1..4 rows and 1..4 tokens, 1..8 rows for one token (the 8- and 4-row
 * decode tiles), odd and even block counts and padded row strides; scales random, or (one run
 * in four) extreme: f16 scales and offsets of every exponent incl. subnormals, MXFP4's e8m0
 * bytes 0..255. want: how many types must have such a tile. */
typedef cb_tile_fn (*inv_tile_getter)(int type, int vnni);
static void check_tile_invariant(const char *name, inv_tile_getter get, int vnni, int want) {
    int n_types = 0;
    for (int i = 0; i < N_TYPES; i++) {
        int type = TYPES[i], ok = 1, kind = kind_of(type);
        cb_tile_fn t512 = get(type, vnni), t2 = cb_avx2_tile(type);
        if (!t512) continue;
        n_types++;
        CHECK(t2 != NULL);
        for (int rep = 0; rep < 160 && ok && t2; rep++) {
            int64_t cols = random_cols(type), nb = cols / cb_type_block_size(type);
            int nt = rep < 40 ? 1 : rndi(1, CB_TILE_T), nr = rndi(1, nt == 1 ? CB_TILE_R1 : CB_TILE_R);
            size_t rb, bb = cb_type_block_bytes(type);
            CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
            size_t ws = rb + (size_t)rndi(0, 3) * 7, xs = act_stride(type, cols);
            uint8_t *w = malloc(ws * (size_t)nr), *xa = malloc(xs * (size_t)nt);
            float *x = malloc(sizeof(float) * (size_t)(cols * nt));
            float o512[CB_TILE_OUT], o2[CB_TILE_OUT];
            for (int r = 0; r < nr; r++) {
                uint8_t *row = w + (size_t)r * ws;
                fill_weights(type, row, ws, 0);
                for (int64_t b = 0; rep % 4 == 3 && kind == 1 && b < nb; b++) {
                    uint8_t *blk = row + (size_t)b * bb;
                    if (type == CB_TYPE_MXFP4) {
                        blk[0] = (uint8_t)rnd();
                    } else { /* any finite f16 (exponent field < 31), offsets too */
                        uint16_t h = (uint16_t)(rnd() % 0x7C00u | (rnd() & 1u) << 15);
                        memcpy(blk, &h, 2);
                        if (type == CB_TYPE_Q4_1 || type == CB_TYPE_Q5_1) {
                            h = (uint16_t)(rnd() % 0x7C00u | (rnd() & 1u) << 15);
                            memcpy(blk + 2, &h, 2);
                        }
                    }
                }
            }
            fill_x(type, x, cols * nt, 0);
            for (int t = 0; t < nt; t++)
                (kind == 1 ? cb_scalar_quantize_q8a : cb_scalar_quantize_q8k)(x + t * cols, cols,
                                                                              xa + (size_t)t * xs);
            t512(nb, w, ws, nr, xa, xs, nt, o512);
            t2(nb, w, ws, nr, xa, xs, nt, o2);
            if (memcmp(o512, o2, sizeof(float) * (size_t)(nr * nt)) != 0) {
                fprintf(stderr, "%s invariant tile %s cols=%lld nr=%d nt=%d: not bit-equal to the "
                        "AVX2 invariant tile\n", name, cb_type_name(type), (long long)cols, nr, nt);
                ok = 0;
            }
            free(w);
            free(xa);
            free(x);
        }
        CHECK(ok);
    }
    if (n_types != want)
        fprintf(stderr, "%s: %d types have an invariant tile, expected %d\n", name, n_types, want);
    CHECK(n_types == want);
}

/* The AVX-512 16-row packing against cb_avx2_rp16_pack: the same bytes (the whole group, and
 * nothing written past it), every packed type, 1..16 rows, odd block counts, row strides with
 * padding; weight bytes random, all 0x00, all 0xFF, or random 0x00/0xFF/0x7F/0x80 (the extremes
 * of every field: quants, scale bits, f16 scales incl. infinities and NaNs). */
typedef void (*rp16_pack_fn)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols,
                             uint8_t *dst);
static void check_pack16(rp16_pack_fn pack, const char *name) {
    static const uint8_t EXTREME[4] = {0x00, 0xFF, 0x7F, 0x80};
    for (int i = 0; i < N_TYPES; i++) {
        int type = TYPES[i];
        if (!cb_avx2_rp_supported(type)) continue;
        int ok = 1;
        for (int rep = 0; rep < 80 && ok; rep++) {
            int64_t bs = cb_type_block_size(type);
            int64_t cols = bs == CB_QKK ? (int64_t)CB_QKK * rndi(1, 5)
                           : type == CB_TYPE_I4_G128 ? 128 * rndi(1, 4)
                                                     : CB_QK * rndi(1, 11);
            int nr = rep < 16 ? rep + 1 : rndi(1, 16), mode = rep % 4;
            size_t rb;
            CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
            size_t ws = rb + (size_t)rndi(0, 3) * 5, gb = cb_avx2_rp16_group_bytes(type, cols);
            uint8_t *w = malloc(ws * (size_t)nr); /* exactly nr rows: reads past them are caught */
            uint8_t *want = aligned(gb + 64), *got = aligned(gb + 64);
            for (size_t j = 0; j < ws * (size_t)nr; j++)
                w[j] = mode == 0 ? (uint8_t)rnd() : mode == 3 ? EXTREME[rnd() % 4]
                                                              : (mode == 1 ? 0x00 : 0xFF);
            if (mode == 0)
                for (int r = 0; r < nr; r++) fill_weights(type, w + (size_t)r * ws, rb, 0);
            memset(want, 0xA5, gb + 64);
            memset(got, 0xA5, gb + 64);
            cb_avx2_rp16_pack(type, w, ws, nr, cols, want);
            pack(type, w, ws, nr, cols, got);
            if (memcmp(want, got, gb + 64) != 0) {
                size_t at = 0;
                while (want[at] == got[at]) at++;
                fprintf(stderr, "%s %s cols=%lld nr=%d ws=%zu mode %d: byte %zu of %zu is %02x, "
                        "cb_avx2_rp16_pack's %02x\n", name, cb_type_name(type), (long long)cols,
                        nr, ws, mode, at, gb, got[at], want[at]);
                ok = 0;
            }
            free(w);
            free(want);
            free(got);
        }
        CHECK(ok);
    }
}

/* quantizers on their own: random blocks, an all-zero block and rounding ties */
static void check_quantizers(const kernels *k) {
    float x[3 * CB_QKK];
    for (int i = 0; i < 3 * CB_QKK; i++) x[i] = 2.0f * rndf();
    for (int i = CB_QKK; i < CB_QKK + 32; i++) x[i] = 0.0f;            /* a zero block */
    for (int i = 2 * CB_QKK; i < 3 * CB_QKK; i++) x[i] = 0.5f * (float)rndi(-253, 253); /* ties */
    x[2 * CB_QKK] = 127.0f; /* amax 127 in every 32-block of the last 256: x*127/amax = x */
    for (int b = 2 * CB_QKK + 32; b < 3 * CB_QKK; b += 32) x[b] = -127.0f;
    cb_q8a_t qa[3 * CB_QKK / CB_QK], ra[3 * CB_QKK / CB_QK];
    cb_q8k_t qk[3], rk[3];
    memset(qa, 0, sizeof qa);
    memset(ra, 0, sizeof ra);
    memset(qk, 0, sizeof qk);
    memset(rk, 0, sizeof rk);
    k->q8a(x, 3 * CB_QKK, qa);
    cb_scalar_quantize_q8a(x, 3 * CB_QKK, ra);
    CHECK(memcmp(qa, ra, sizeof qa) == 0);
    k->q8k(x, 3 * CB_QKK, qk);
    cb_scalar_quantize_q8k(x, 3 * CB_QKK, rk);
    CHECK(memcmp(qk, rk, sizeof qk) == 0);
    /* the ties did round to even: 2.5 -> 2, not 3 */
    float tie[32] = {127.0f, 2.5f, -2.5f, 3.5f};
    k->q8a(tie, 32, qa);
    CHECK(qa[0].qs[0] == 127 && qa[0].qs[1] == 2 && qa[0].qs[2] == -2 && qa[0].qs[3] == 4);
}

static void run(const kernels *k, int with_rp) {
    check_quantizers(k);
    for (int i = 0; i < N_TYPES; i++) {
        int type = TYPES[i], ok = 1;
        for (int rep = 0; rep < 100; rep++) ok &= check_tile(k, type, rep & 1);
        CHECK(ok);
        if (with_rp && cb_avx2_rp_supported(type)) {
            ok = 1;
            for (int rep = 0; rep < 100; rep++) ok &= check_rp(k, type, rep & 1);
            CHECK(ok);
        }
    }
}

/* Whether a 16-row R16 tile's output o16 (out[r * nt + t]; rows past m's: 0) equals cb_matmul on
 * the source matrix m at the AVX2 level bit for bit (y: scratch for nt x 16 floats). */
static int same_as_avx2(const cb_matrix_t *m, const float *x, int nt, const float *o16, float *y,
                        const char *name, int layout) {
    const int nr = (int)m->rows;
    cb_simd_level prev = cb_cpu_set_max_level(CB_SIMD_AVX2);
    CHECK(cb_matmul(m, x, nt, m->cols, y, nr, NULL) == CB_OK);
    cb_cpu_set_max_level(prev);
    for (int r = 0; r < 16; r++)
        for (int t = 0; t < nt; t++) {
            float want = r < nr ? y[t * nr + r] : 0.0f, got = o16[r * nt + t];
            if (memcmp(&want, &got, 4) != 0) {
                fprintf(stderr, "%s %s cols=%lld nr=%d nt=%d: [%d,%d] = %.9g, want %.9g\n", name,
                        cb_type_name(layout), (long long)m->cols, nr, nt, r, t, got, want);
                return 0;
            }
        }
    return 1;
}

/* The R16 layouts' tile (Q8_0_R16, Q5_0_R16; quant_r16.c packs): a group of nr <= 16 rows
 * against nt <= 8 tokens equals cb_matmul on the source rows at the AVX2 level bit for bit (the
 * same integer sums and float order), extreme weights and activations included; the padding rows
 * come out 0. */
static void check_r16(rp16_tile_fn tile, void (*rpq)(int, const float *, int64_t, uint8_t *),
                      const char *name) {
    for (int i = 0; i < 2; i++) {
        const int type = i ? CB_TYPE_Q5_0 : CB_TYPE_Q8_0, layout = cb_r16_layout(type);
        int ok = 1;
        for (int rep = 0; rep < 60 && ok; rep++) {
            int64_t cols = CB_QK * rndi(1, 9), nb = cols / CB_QK;
            int nr = rndi(1, 16), nt = rndi(1, 8);
            size_t rb, xs = cb_avx2_rp_act_stride(cols), need = cb_r16_bytes(layout, nr, cols);
            CHECK(cb_type_row_bytes(type, cols, &rb) == CB_OK);
            uint8_t *w = malloc(rb * (size_t)nr), *pk = aligned(need), *xa = aligned(xs * 8);
            float *x = malloc(sizeof(float) * (size_t)(cols * nt)), *y = malloc(sizeof(float) * 16 * 8);
            float o16[16 * 8];
            fill_weights(type, w, rb * (size_t)nr, 0);
            if (rep & 1) /* extreme quants: all -128 / 127 (Q8_0), 0 / 31 (Q5_0) */
                for (int r = 0; r < nr; r++)
                    for (int64_t k = 0; k < nb; k++)
                        memset(w + (size_t)r * rb + (size_t)k * (type == CB_TYPE_Q8_0 ? 34 : 22) + 2,
                               (rep & 2) ? 0x80 : 0x7f, type == CB_TYPE_Q8_0 ? 32 : 20);
            for (int64_t j = 0; j < cols * nt; j++)
                x[j] = (rep & 1) ? ((j & 1) ? 127.0f : -127.0f) : 4.0f * rndf();
            cb_matrix_t m = {type, nr, cols, rb, w};
            CHECK(cb_pack_r16(&m, pk, need, NULL) == CB_OK);
            for (int t = 0; t < nt; t++) rpq(type, x + t * cols, cols, xa + (size_t)t * xs);
            tile(layout, pk, nb, xa, xs, nt, o16);
            ok &= same_as_avx2(&m, x, nt, o16, y, name, layout);
            free(w); free(pk); free(xa); free(x); free(y);
        }
        CHECK(ok);
    }
}

/* The Q6_K_R16 and Q4_K_R16 layouts' tile (quant_avx512_k.c): the same against nt <= 4 cb_q8k_t
 * rows, scales (and mins) of all values, extreme quants (all 0 / all 63 or 15) and activations
 * included. */
static void check_r16k(rp16_tile_fn tile, void (*q8k)(const float *, int64_t, void *), const char *name) {
    int ok = 1;
    for (int rep = 0; rep < 120 && ok; rep++) {
        const int type = rep % 8 < 4 ? CB_TYPE_Q6_K : CB_TYPE_Q4_K, layout = cb_r16_layout(type);
        const size_t bb = cb_type_block_bytes(type);
        int64_t cols = CB_QKK * rndi(1, 4), nb = cols / CB_QKK;
        int nr = rndi(1, 16), nt = rndi(1, 4);
        size_t rb = (size_t)nb * bb, xs = (size_t)nb * sizeof(cb_q8k_t);
        size_t need = cb_r16_bytes(layout, nr, cols);
        uint8_t *w = malloc(rb * (size_t)nr), *pk = aligned(need), *xa = aligned(xs * 4);
        float *x = malloc(sizeof(float) * (size_t)(cols * nt)), *y = malloc(sizeof(float) * 16 * 4);
        float o16[16 * 4];
        fill_weights(type, w, rb * (size_t)nr, 0);
        for (int64_t k = 0; (rep & 1) && k < nb * nr; k++) { /* extreme quants and scales */
            uint8_t *blk = w + (size_t)k * bb;
            if (type == CB_TYPE_Q6_K) { /* q = 0 or 63, scales +-127 */
                memset(blk, (rep & 2) ? 0xFF : 0x00, 192);
                memset(blk + 192, (rep & 4) ? 0x81 : 0x7F, 16);
            } else { /* q = 0 or 15, scales and mins 63 or 0 */
                memset(blk + 16, (rep & 2) ? 0xFF : 0x00, 128);
                memset(blk + 4, (rep & 4) ? 0xFF : 0x00, 12);
            }
        }
        for (int64_t j = 0; j < cols * nt; j++) x[j] = (rep & 1) ? ((j & 1) ? 127.0f : -127.0f) : 4.0f * rndf();
        cb_matrix_t m = {type, nr, cols, rb, w};
        CHECK(cb_pack_r16(&m, pk, need, NULL) == CB_OK);
        for (int t = 0; t < nt; t++) q8k(x + t * cols, cols, xa + (size_t)t * xs);
        tile(layout, pk, nb, xa, xs, nt, o16);
        ok &= same_as_avx2(&m, x, nt, o16, y, name, layout);
        free(w); free(pk); free(xa); free(x); free(y);
    }
    CHECK(ok);
}

int main(void) {
    cb_simd_level cpu = cb_cpu_detect();
    int with_rp = cpu >= CB_SIMD_AVX2;
    if (!with_rp)
        printf("test_quant_avx512: no AVX2 here: the packed-row tile is not checked "
               "(it reads cb_avx2_rp_pack's groups)\n");
    run(&EMULATED, with_rp);
    if (with_rp) { /* cb_avx2_tile runs natively: the CPU must have AVX2 */
        check_tile_invariant("emulated", cb_avx512emu_tile_invariant, 0, 3);
        check_tile_invariant("emulated vnni", cb_avx512emu_tile_invariant, 1, 9);
        run(&EMULATED_VNNI, with_rp);
        check_rp_same(&EMULATED, &EMULATED_VNNI);
        check_rp16(&EMULATED_VNNI, cb_avx512emu_rp16_tile_vnni, "emulated vnni 16 rows");
        check_r16(cb_avx512emu_r16_tile_vnni, cb_avx512emu_rp_quantize, "emulated vnni");
        check_r16k(cb_avx512emu_r16_tile_vnni, cb_avx512emu_quantize_q8k, "emulated vnni");
        check_pack16(cb_avx512emu_rp16_pack, "emulated 16-row packing");
    }
    if (cpu >= CB_SIMD_AVX512) {
        printf("test_quant_avx512: this CPU has AVX-512: checking the native kernels too\n");
        run(&NATIVE, with_rp);
        check_tile_invariant("native", cb_avx512_tile_invariant, 0, 3);
        check_pack16(cb_avx512_rp16_pack, "native 16-row packing");
        if (cpu >= CB_SIMD_AVX512_VNNI) {
            printf("test_quant_avx512: this CPU has AVX512-VNNI: checking its packed and invariant tiles\n");
            check_tile_invariant("native vnni", cb_avx512_tile_invariant, 1, 9);
            run(&NATIVE_VNNI, with_rp);
            check_rp_same(&NATIVE, &NATIVE_VNNI);
            check_rp16(&NATIVE_VNNI, cb_avx512_rp16_tile_vnni, "native vnni 16 rows");
            check_r16(cb_avx512_r16_tile_vnni, cb_avx512_rp_quantize, "native vnni");
            check_r16k(cb_avx512_r16_tile_vnni, cb_avx512_quantize_q8k, "native vnni");
        }
    } else {
        printf("test_quant_avx512: no AVX-512 here: emulated kernels only\n");
    }
    TEST_MAIN_END("test_quant_avx512");
}
