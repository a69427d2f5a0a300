/* The 16-row packing of the AVX512-VNNI matmul path alone: every 16-row group of a weight
 * matrix (random valid bytes) packed into one reused 64-byte aligned buffer, as a matmul thread
 * does, by cb_avx2_rp16_pack and by cb_avx512_rp16_pack, alternately; prints the median time of
 * a pass over the whole matrix for each, and the weight bytes read per second.
 * Usage: pack16 <type name> <rows> <cols> [passes]   (e.g. pack16 q6_K 151936 2048)
 * Build (after `python setup.py build_ext --inplace`, from the repository root):
 *   gcc -O2 -Iinclude -Icolibri/_core tools/bench/pack16.c \
 *       build/temp.linux-x86_64-cpython-311/libcolibri_c.a -lm -pthread -o /tmp/pack16
 * (the temp.* folder of your platform). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "colibri/cpu.h"
#include "quant_impl.h"

typedef void (*pack_fn)(int type, const uint8_t *w, size_t ws, int nr, int64_t cols, uint8_t *dst);

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pass(pack_fn pack, int type, const uint8_t *w, size_t rb, int64_t rows, int64_t cols,
                   uint8_t *buf) {
    double t0 = now();
    for (int64_t r = 0; r < rows; r += 16) {
        int nr = rows - r < 16 ? (int)(rows - r) : 16;
        pack(type, w + (size_t)r * rb, rb, nr, cols, buf);
    }
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: pack16 <type> <rows> <cols> [passes]\n");
        return 2;
    }
    int type = -1;
    for (int t = 0; t < 64 && type < 0; t++) {
        const char *n = cb_type_name(t);
        if (n && strcasecmp(n, argv[1]) == 0) type = t;
    }
    int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
    int passes = argc > 4 ? atoi(argv[4]) : 9;
    size_t rb;
    if (type < 0 || !cb_avx2_rp_supported(type) || cb_type_row_bytes(type, cols, &rb) != CB_OK) {
        fprintf(stderr, "pack16: %s %lld: not a packed type and shape\n", argv[1], (long long)cols);
        return 2;
    }
    if (cb_cpu_detect() < CB_SIMD_AVX512) {
        fprintf(stderr, "pack16: this CPU has no AVX-512\n");
        return 2;
    }
    size_t bytes = rb * (size_t)rows, gb = cb_avx2_rp16_group_bytes(type, cols);
    uint8_t *w = malloc(bytes), *buf = NULL;
    if (!w || posix_memalign((void **)&buf, 64, gb + 64) != 0) return 1;
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < bytes; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        w[i] = (uint8_t)(s >> 24);
    }
    const pack_fn fn[2] = {cb_avx2_rp16_pack, cb_avx512_rp16_pack};
    const char *name[2] = {"cb_avx2_rp16_pack", "cb_avx512_rp16_pack"};
    double *by[2] = {malloc(sizeof(double) * (size_t)passes), malloc(sizeof(double) * (size_t)passes)};
    pass(fn[0], type, w, rb, rows, cols, buf); /* warm: page the matrix in */
    for (int p = 0; p < passes; p++)
        for (int k = 0; k < 2; k++) { /* alternate which goes first */
            int f = (p + k) & 1;
            by[f][p] = pass(fn[f], type, w, rb, rows, cols, buf);
        }
    printf("%s %lldx%lld (%.1f MB, %lld groups of 16 rows, %zu packed bytes per group)\n",
           cb_type_name(type), (long long)rows, (long long)cols, (double)bytes / 1e6,
           (long long)((rows + 15) / 16), gb);
    double med[2];
    for (int k = 0; k < 2; k++) {
        qsort(by[k], (size_t)passes, sizeof(double), cmp_double);
        med[k] = by[k][passes / 2];
        printf("  %-20s median %8.3f ms  (%.2f GB/s of weights, %.1f ns per group)\n", name[k],
               1e3 * med[k], (double)bytes / med[k] / 1e9, 1e9 * med[k] / (double)((rows + 15) / 16));
    }
    printf("  speedup %.2fx\n", med[0] / med[1]);
    free(w);
    free(buf);
    for (int k = 0; k < 2; k++) free(by[k]);
    return 0;
}
