/* Plain streaming read bandwidth: each of T threads sums its share of a large buffer with
 * 256-bit loads (AVX2 when compiled with -mavx2, else 128-bit SSE2); prints the best GB/s of
 * R passes over the whole buffer, 0, and the sustained GB/s: the bytes of passes 2..R over
 * their total time (the first pass is a warm-up; R = 1: that pass). The best pass is the
 * STREAM convention; the sustained rate is the one to set beside another rate averaged over a
 * comparable time. Usage: membw <MiB> <threads> <passes>.
 * Compiled and run by colibri.tools.membw (tools/bench/quant_kernels.py, colibri.tools.roofline)
 * as the peer of the matvec kernels and of decode. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint8_t *p;
    size_t n;
    double sink;
    pthread_barrier_t *bar;
    int passes;
    double *best;
    double *total; /* thread 0: the seconds of passes 2..R (of pass 1 when R = 1) */
    int index;
} arg_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double read_all(const uint8_t *p, size_t n) {
#ifdef __AVX2__
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(const void *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(const void *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(const void *)(p + i + 96)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    int64_t out[4];
    _mm256_storeu_si256((__m256i *)(void *)out, a0);
    return (double)(out[0] + out[1] + out[2] + out[3]);
#else
    __m128i a0 = _mm_setzero_si128(), a1 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm_add_epi64(a0, _mm_load_si128((const __m128i *)(const void *)(p + i)));
        a1 = _mm_add_epi64(a1, _mm_load_si128((const __m128i *)(const void *)(p + i + 16)));
    }
    a0 = _mm_add_epi64(a0, a1);
    int64_t out[2];
    _mm_storeu_si128((__m128i *)(void *)out, a0);
    return (double)(out[0] + out[1]);
#endif
}

static void *worker(void *v) {
    arg_t *a = v;
    for (int r = 0; r < a->passes; r++) {
        pthread_barrier_wait(a->bar);
        double t0 = now();
        a->sink += read_all(a->p, a->n);
        pthread_barrier_wait(a->bar);
        double dt = now() - t0;
        if (a->index == 0 && dt < *a->best) *a->best = dt;
        if (a->index == 0 && (r > 0 || a->passes == 1)) *a->total += dt;
    }
    return NULL;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 512;
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    int passes = argc > 3 ? atoi(argv[3]) : 5;
    if (threads < 1 || threads > 64 || mib < 1 || passes < 1) return 2;
    size_t n = mib << 20;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, n) != 0) return 1;
    memset(buf, 1, n);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    pthread_t th[64];
    arg_t args[64];
    double best = 1e30, total = 0;
    size_t share = n / (size_t)threads / 128 * 128;
    for (int i = 0; i < threads; i++) {
        args[i] = (arg_t){buf + (size_t)i * share, share, 0.0, &bar, passes, &best, &total, i};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    double sink = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        sink += args[i].sink;
    }
    double bytes = (double)(share * (size_t)threads);
    printf("%.3f %g %.3f\n", bytes / best / 1e9, sink * 0.0,
           bytes * (passes > 1 ? passes - 1 : 1) / total / 1e9);
    free(buf);
    return 0;
}
