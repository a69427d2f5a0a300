/* Read bandwidth of runs of R bytes every S bytes (the KV cache's access patterns): attention
 * reads one K/V head's rows, head_dim values a token; position-major they are runs of a few
 * hundred bytes a token stride apart, in pages of 256 tokens runs of tens of KiB. Prints the best
 * GB/s of 5 passes per case, over ~32 MiB of runs (caches flushed between passes).
 * Usage: kv_stream [run:stride ...]   e.g. kv_stream 512:16384 131072:1048576 512:512
 * Build: cc -O2 -mavx2 -o kv_stream tools/bench/kv_stream.c */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float sum_runs(const char *b, size_t n_runs, size_t stride, size_t run) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (size_t t = 0; t < n_runs; t++) {
        const float *r = (const float *)(const void *)(b + t * stride);
        for (size_t i = 0; i < run / 4; i += 16) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(r + i));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(r + i + 8));
        }
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(a0, a1));
    return o[0] + o[7];
}

int main(int argc, char **argv) {
    const char *def[] = {"512:16384", "1024:36864", "8192:65536", "131072:1048576", "512:512"};
    int nc = argc > 1 ? argc - 1 : 5;
    size_t flush_n = (size_t)64 << 20;
    char *flush = malloc(flush_n);
    if (!flush) return 1;
    float sink = 0;
    for (int c = 0; c < nc; c++) {
        size_t run = 0, stride = 0;
        if (sscanf(argc > 1 ? argv[c + 1] : def[c], "%zu:%zu", &run, &stride) != 2 || run < 64 ||
            run % 64 || stride < run) {
            fprintf(stderr, "bad case %s (run:stride, run a multiple of 64, stride >= run)\n",
                    argc > 1 ? argv[c + 1] : def[c]);
            return 2;
        }
        size_t n_runs = ((size_t)32 << 20) / run, sz = n_runs * stride + ((size_t)2 << 20);
        char *m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 1;
        char *b = (char *)(((size_t)m + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1));
        madvise(b, n_runs * stride, MADV_HUGEPAGE);
        memset(b, 1, n_runs * stride);
        double best = 0;
        for (int rep = 0; rep < 5; rep++) {
            memset(flush, rep, flush_n);
            double t0 = now();
            sink += sum_runs(b, n_runs, stride, run);
            double gbs = (double)(n_runs * run) / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("runs of %7zu bytes every %8zu bytes: %5.1f GB/s\n", run, stride, best);
        munmap(m, sz);
    }
    free(flush);
    return sink == 0.5f;
}
