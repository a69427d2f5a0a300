/* One-token matvec from memory: colibri's cb_matmul against ggml's vec_dot (llama.cpp's CPU
 * kernel, loaded from libggml-cpu.so at GGMLCPU) on the same weights. Driven by
 * tools/bench/vs_ggml_matvec.py, which compiles it with colibri's C sources.
 *
 *   vs_ggml_matvec TYPE ROWS COLS NMATS ITERS THREADS R16 [TOKENS]
 *
 * TYPE a GGUF type id (6 Q5_0, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K; the low-bit types 10 Q2_K,
 * 11 Q3_K, 15 Q8_K, 16-23 IQ2_XXS IQ2_XS IQ3_XXS IQ1_S IQ4_NL IQ3_S IQ2_S IQ4_XS, 29 IQ1_M,
 * 34 TQ1_0, 35 TQ2_0); NMATS distinct matrices of ROWS x COLS
 * with random quants and small f16 scales, on huge pages, read in turn (NMATS x the matrix well
 * above L3: every read is from DRAM, as a model's experts and head are); R16 1 = colibri reads
 * its R16 layout (packed first), 0 = the file layout. ggml reads a different matrix than colibri
 * in each iteration (half the set away), one thread, a row at a time; colibri uses THREADS.
 * Prints the median and best time of each, GB/s of weight bytes, and the largest difference of
 * their outputs (both quantize the activations their own way). TOKENS > 1: colibri's cb_matmul
 * of TOKENS activation rows against ggml's vec_dot of every (row, token) pair, a row meeting
 * its tokens while in cache (as ggml's mul_mat does without a repacked layout). VS_GGML_MAX_SIMD=N caps colibri's
 * SIMD level (cb_simd_level: 1 AVX2). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <colibri/cpu.h>
#include <colibri/quant.h>
#include <colibri/threadpool.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef void (*from_float_t)(const float *, void *, int64_t);
typedef void (*vec_dot_t)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
typedef struct {
    from_float_t from_float;
    vec_dot_t vec_dot;
    int vec_dot_type;
    int64_t nrows;
} traits_t;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *huge(size_t bytes) {
    const size_t H = (size_t)1 << 21;
    uint8_t *p = mmap(NULL, bytes + H, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    p = (uint8_t *)(((uintptr_t)p + H - 1) & ~(uintptr_t)(H - 1));
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS NMATS ITERS THREADS R16 [TOKENS]\n", argv[0]);
        return 2;
    }
    const int type = atoi(argv[1]), nm = atoi(argv[4]), it = atoi(argv[5]), th = atoi(argv[6]);
    const int r16 = atoi(argv[7]), nt = argc > 8 ? atoi(argv[8]) : 1;
    const long rows = atol(argv[2]), cols = atol(argv[3]);
    int bs, bb, doff; /* values a block, bytes a block, the offset of its f16 d */
    switch (type) {
    case 6: bs = 32, bb = 22, doff = 0; break;
    case 8: bs = 32, bb = 34, doff = 0; break;
    case 12: bs = 256, bb = 144, doff = 0; break;
    case 13: bs = 256, bb = 176, doff = 0; break;
    case 14: bs = 256, bb = 210, doff = 208; break;
    case 10: bs = 256, bb = 84, doff = 80; break;
    case 11: bs = 256, bb = 110, doff = 108; break;
    case 15: bs = 256, bb = 292, doff = -1; break; /* f32 d at 0 */
    case 16: bs = 256, bb = 66, doff = 0; break;
    case 17: bs = 256, bb = 74, doff = 0; break;
    case 18: bs = 256, bb = 98, doff = 0; break;
    case 19: bs = 256, bb = 50, doff = 0; break;
    case 20: bs = 32, bb = 18, doff = 0; break;
    case 21: bs = 256, bb = 110, doff = 0; break;
    case 22: bs = 256, bb = 82, doff = 0; break;
    case 23: bs = 256, bb = 136, doff = 0; break;
    case 29: bs = 256, bb = 56, doff = -2; break; /* f16 d in the top nibbles of 4 u16 at 48 */
    case 34: bs = 256, bb = 54, doff = 52; break;
    case 35: bs = 256, bb = 66, doff = 64; break;
    default: fprintf(stderr, "type %d: not a type of this bench\n", type); return 2;
    }
    if (rows <= 0 || cols <= 0 || cols % bs || nm <= 0 || it <= 0 || th <= 0 || nt <= 0) {
        fprintf(stderr, "bad shape or counts\n");
        return 2;
    }
    const size_t rb = (size_t)(cols / bs) * (size_t)bb, mb = rb * (size_t)rows;
    uint8_t *w = huge(mb * (size_t)nm);
    float *x = malloc(sizeof(float) * (size_t)(cols * nt)), *y = malloc(sizeof(float) * (size_t)(rows * nt));
    float *y2 = malloc(sizeof(float) * (size_t)rows);
    void *xq = calloc((size_t)(cols * nt), 2);
    double *tc = malloc(sizeof(double) * (size_t)it), *tg = malloc(sizeof(double) * (size_t)it);
    cb_matrix_t *m = calloc((size_t)nm, sizeof *m);
    if (!w || !x || !y || !y2 || !xq || !tc || !tg || !m) { fprintf(stderr, "out of memory\n"); return 1; }
    srand(1);
    for (size_t i = 0; i < mb * (size_t)nm; i++) w[i] = (uint8_t)rand();
    for (size_t b = 0; b < mb * (size_t)nm / (size_t)bb; b++) {
        const uint16_t h = (uint16_t)(0x2000 + (rand() & 0x3ff)); /* ~0.008: finite sums */
        uint8_t *blk = w + b * (size_t)bb;
        if (doff >= 0) {
            memcpy(blk + doff, &h, 2);
        } else if (doff == -1) {
            const float d = 0.008f;
            memcpy(blk, &d, 4);
        } else {
            for (int k = 0; k < 4; k++) {
                uint16_t s;
                memcpy(&s, blk + 48 + 2 * k, 2);
                s = (uint16_t)((s & 0x0FFFu) | ((h >> (4 * k)) & 15u) << 12);
                memcpy(blk + 48 + 2 * k, &s, 2);
            }
        }
        if (type == 12 || type == 13) memcpy(blk + 2, &h, 2); /* Q4_K's, Q5_K's dmin */
        if (type == 10) memcpy(blk + 82, &h, 2);            /* Q2_K's dmin */
    }
    for (long c = 0; c < cols * nt; c++) x[c] = (float)rand() / (float)RAND_MAX - 0.5f;
    if (getenv("VS_GGML_MAX_SIMD")) cb_cpu_set_max_level((cb_simd_level)atoi(getenv("VS_GGML_MAX_SIMD")));
    cb_threadpool_t *pool;
    if (cb_threadpool_new(th, &pool) != CB_OK) return 1;
    for (int i = 0; i < nm; i++) m[i] = (cb_matrix_t){type, rows, cols, rb, w + (size_t)i * mb};
    if (r16) {
        const int lay = cb_r16_layout(type);
        const size_t pb = cb_r16_bytes(lay, rows, cols);
        uint8_t *pk = lay ? huge(pb * (size_t)nm) : NULL;
        if (!pk) { fprintf(stderr, "no R16 layout for type %d\n", type); return 2; }
        for (int i = 0; i < nm; i++) {
            if (cb_pack_r16(&m[i], pk + (size_t)i * pb, pb, pool) != CB_OK) return 1;
            m[i] = (cb_matrix_t){lay, rows, cols, rb, pk + (size_t)i * pb};
        }
    }
    void *h = dlopen(getenv("GGMLCPU"), RTLD_NOW | RTLD_GLOBAL);
    if (!h) { fprintf(stderr, "GGMLCPU: %s\n", dlerror()); return 2; }
    void (*init)(void) = (void (*)(void))dlsym(h, "ggml_cpu_init");
    const traits_t *(*traits)(int) = (const traits_t *(*)(int))dlsym(h, "ggml_get_type_traits_cpu");
    if (!init || !traits) { fprintf(stderr, "not a ggml CPU library\n"); return 2; }
    init();
    const traits_t *tr = traits(type), *tq = traits(tr->vec_dot_type);
    if (!tr->vec_dot || !tq->from_float) { fprintf(stderr, "ggml has no vec_dot for type %d\n", type); return 3; }
    const size_t xqs = (size_t)cols * 2; /* bytes of one quantized activation row (an upper bound) */
    for (int t = 0; t < nt; t++) tq->from_float(x + (size_t)t * (size_t)cols, (uint8_t *)xq + (size_t)t * xqs, cols);
    for (int k = 0; k < it; k++) {
        double t0 = now();
        if (cb_matmul(&m[k % nm], x, nt, cols, y, rows, pool) != CB_OK) return 1;
        tc[k] = now() - t0;
        const uint8_t *wg = w + (size_t)((k + nm / 2) % nm) * mb;
        t0 = now();
        for (long r = 0; r < rows; r++)
            for (int t = 0; t < nt; t++)
                tr->vec_dot((int)cols, &y2[r], 0, wg + (size_t)r * rb, 0, (uint8_t *)xq + (size_t)t * xqs, 0, 1);
        tg[k] = now() - t0;
    }
    cb_matmul(&m[0], x, 1, cols, y, rows, pool);
    for (long r = 0; r < rows; r++) tr->vec_dot((int)cols, &y2[r], 0, w + (size_t)r * rb, 0, xq, 0, 1);
    double diff = 0;
    for (long r = 0; r < rows; r++) diff = diff > fabsf(y[r] - y2[r]) ? diff : fabsf(y[r] - y2[r]);
    qsort(tc, (size_t)it, sizeof(double), cmpd);
    qsort(tg, (size_t)it, sizeof(double), cmpd);
    double nmax = 0;
    for (long r = 0; r < rows; r++) nmax = nmax > fabsf(y2[r]) ? nmax : fabsf(y2[r]);
    printf("%s colibri %.1f us (%.1f GB/s) best %.1f | ggml %.1f us (%.1f GB/s) best %.1f | ggml/colibri %.2f | max diff %.3g (rel %.2g)\n",
           cb_simd_level_str(cb_cpu_level()), tc[it / 2] * 1e6, (double)mb / tc[it / 2] / 1e9, tc[0] * 1e6,
           tg[it / 2] * 1e6, (double)mb / tg[it / 2] / 1e9, tg[0] * 1e6, tg[it / 2] / tc[it / 2], diff,
           nmax > 0 ? diff / nmax : 0.0);
    cb_threadpool_free(pool);
    return 0;
}
