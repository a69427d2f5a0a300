/* Read throughput of a file against queue depth, the way the expert store reads: blocks of one
 * size at random block-aligned offsets, each block read once per run (no page-cache hit), with
 * QD reads in flight. Three ways to keep QD reads in flight:
 *   pread   QD threads, each a blocking pread(2) on a buffered descriptor (the store's readers
 *           today); the file's cached pages are dropped (POSIX_FADV_DONTNEED) before each run
 *   direct  the same with O_DIRECT (reads bypass the page cache)
 *   uring   one thread, io_uring with QD O_DIRECT reads in flight (raw syscalls: no liburing)
 * Prints one line per (mode, QD): "mode qd MB/s reads". Usage:
 *   diskqd FILE BLOCK_BYTES SECONDS_PER_RUN MODES QDS      e.g. diskqd m.gguf 1048576 2 pread,uring 1,2,4,8,16
 * Compiled and run by tools/bench/disk.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    int fd;
    size_t block;
    const uint64_t *order; /* block indices, a permutation */
    size_t n_blocks;
    atomic_size_t next;
    double deadline;
    atomic_size_t done;
    atomic_int failed;
} job_t;

static void *reader(void *arg) {
    job_t *j = arg;
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, j->block)) {
        atomic_store(&j->failed, ENOMEM);
        return NULL;
    }
    for (;;) {
        if (now() >= j->deadline) break;
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n_blocks) break;
        size_t got = 0;
        off_t off = (off_t)(j->order[i] * j->block);
        while (got < j->block) {
            ssize_t r = pread(j->fd, (char *)buf + got, j->block - got, off + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                atomic_store(&j->failed, r < 0 ? errno : EIO);
                free(buf);
                return NULL;
            }
            got += (size_t)r;
        }
        atomic_fetch_add(&j->done, 1);
    }
    free(buf);
    return NULL;
}

static int run_threads(job_t *j, int qd) {
    pthread_t th[256];
    int n = 0;
    for (; n < qd; n++)
        if (pthread_create(&th[n], NULL, reader, j)) break;
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    return n == qd ? atomic_load(&j->failed) : EAGAIN;
}

/* ---- io_uring, raw */
typedef struct {
    int fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_ptr, *cq_ptr;
    size_t sq_len, cq_len, sqes_len;
} ring_t;

static int ring_init(ring_t *r, unsigned entries) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    memset(r, 0, sizeof *r);
    r->fd = (int)syscall(__NR_io_uring_setup, entries, &p);
    if (r->fd < 0) return errno;
    r->sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    r->sq_ptr = mmap(NULL, r->sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_SQ_RING);
    r->cq_ptr = mmap(NULL, r->cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_CQ_RING);
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                   IORING_OFF_SQES);
    if (r->sq_ptr == MAP_FAILED || r->cq_ptr == MAP_FAILED || r->sqes == MAP_FAILED) return ENOMEM;
    char *sq = r->sq_ptr, *cq = r->cq_ptr;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

static void ring_free(ring_t *r) {
    if (r->sqes && r->sqes != MAP_FAILED) munmap(r->sqes, r->sqes_len);
    if (r->cq_ptr && r->cq_ptr != MAP_FAILED) munmap(r->cq_ptr, r->cq_len);
    if (r->sq_ptr && r->sq_ptr != MAP_FAILED) munmap(r->sq_ptr, r->sq_len);
    if (r->fd >= 0) close(r->fd);
}

static void ring_push_read(ring_t *r, int fd, void *buf, unsigned len, uint64_t off, uint64_t tag) {
    unsigned tail = *r->sq_tail;
    unsigned idx = tail & *r->sq_mask;
    struct io_uring_sqe *e = &r->sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = fd;
    e->addr = (uint64_t)(uintptr_t)buf;
    e->len = len;
    e->off = off;
    e->user_data = tag;
    r->sq_array[idx] = idx;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

static int run_uring(int fd, size_t block, const uint64_t *order, size_t n_blocks, int qd,
                     double deadline, size_t *done) {
    ring_t r;
    int err = ring_init(&r, (unsigned)qd);
    if (err) {
        ring_free(&r);
        return err;
    }
    uint8_t *bufs = NULL;
    if (posix_memalign((void **)&bufs, 4096, block * (size_t)qd)) {
        ring_free(&r);
        return ENOMEM;
    }
    size_t next = 0, inflight = 0;
    *done = 0;
    for (int s = 0; s < qd && next < n_blocks; s++, next++, inflight++)
        ring_push_read(&r, fd, bufs + (size_t)s * block, (unsigned)block, order[next] * block,
                       (uint64_t)s);
    unsigned to_submit = (unsigned)inflight;
    while (inflight) {
        long rc = syscall(__NR_io_uring_enter, r.fd, to_submit, 1, IORING_ENTER_GETEVENTS, NULL, 0);
        if (rc < 0 && errno != EINTR) {
            err = errno;
            break;
        }
        to_submit = 0;
        unsigned head = *r.cq_head;
        unsigned tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++) {
            struct io_uring_cqe *c = &r.cqes[head & *r.cq_mask];
            int slot = (int)c->user_data;
            inflight--;
            if (c->res != (int)block) err = c->res < 0 ? -c->res : EIO;
            else (*done)++;
            if (!err && next < n_blocks && now() < deadline) {
                ring_push_read(&r, fd, bufs + (size_t)slot * block, (unsigned)block,
                               order[next++] * block, (uint64_t)slot);
                to_submit++;
                inflight++;
            }
        }
        __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
        if (err && !inflight) break;
    }
    free(bufs);
    ring_free(&r);
    return err;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: diskqd FILE BLOCK_BYTES SECONDS MODES QDS\n");
        return 2;
    }
    const char *path = argv[1];
    size_t block = strtoull(argv[2], NULL, 10);
    double secs = atof(argv[3]);
    if (block == 0 || block % 4096 || block > (1u << 30) || !(secs > 0)) {
        fprintf(stderr, "diskqd: BLOCK_BYTES must be a positive multiple of 4096 (<= 1 GiB), SECONDS > 0\n");
        return 2;
    }
    struct stat st;
    if (stat(path, &st)) {
        perror(path);
        return 1;
    }
    size_t n_blocks = (size_t)st.st_size / block;
    if (n_blocks < 4) {
        fprintf(stderr, "diskqd: %s holds fewer than 4 blocks of %zu bytes\n", path, block);
        return 1;
    }
    uint64_t *order = malloc(n_blocks * sizeof *order);
    if (!order) return 1;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char modes[256];
    snprintf(modes, sizeof modes, "%s", argv[4]);
    for (char *m = strtok(modes, ","); m; m = strtok(NULL, ",")) {
        int direct = strcmp(m, "pread") != 0;
        int uring = strcmp(m, "uring") == 0;
        if (strcmp(m, "pread") && strcmp(m, "direct") && strcmp(m, "uring")) {
            fprintf(stderr, "diskqd: unknown mode %s (pread, direct, uring)\n", m);
            return 2;
        }
        char qds[256];
        snprintf(qds, sizeof qds, "%s", argv[5]);
        char *save = NULL;
        for (char *q = strtok_r(qds, ",", &save); q; q = strtok_r(NULL, ",", &save)) {
            int qd = atoi(q);
            if (qd < 1 || qd > 256) {
                fprintf(stderr, "diskqd: queue depth %s out of 1..256\n", q);
                return 2;
            }
            for (size_t i = 0; i < n_blocks; i++) order[i] = i;
            for (size_t i = n_blocks - 1; i > 0; i--) { /* xorshift Fisher-Yates */
                seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
                size_t k = (size_t)(seed % (i + 1));
                uint64_t t = order[i];
                order[i] = order[k], order[k] = t;
            }
            int fd = open(path, O_RDONLY | (direct ? O_DIRECT : 0));
            if (fd < 0) {
                perror(path);
                return 1;
            }
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            double t0 = now(), deadline = t0 + secs;
            size_t done = 0;
            int err;
            if (uring) {
                err = run_uring(fd, block, order, n_blocks, qd, deadline, &done);
            } else {
                job_t j = {.fd = fd, .block = block, .order = order, .n_blocks = n_blocks,
                           .deadline = deadline};
                err = run_threads(&j, qd);
                done = atomic_load(&j.done);
            }
            double dt = now() - t0;
            close(fd);
            if (err) {
                fprintf(stderr, "diskqd: %s qd %d: %s\n", m, qd, strerror(err));
                printf("%s %d nan 0\n", m, qd);
            } else {
                printf("%s %d %.1f %zu\n", m, qd, (double)done * (double)block / dt / 1e6, done);
            }
            fflush(stdout);
        }
    }
    free(order);
    return 0;
}
