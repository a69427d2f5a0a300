/* The expert store's readers (experts_impl.h): how an expert's bytes get into its slot. pread_all
 * reads one range (short reads continued, EINTR retried, errors named with the file, layer,
 * expert and range), cb_read_expert one expert (one read when its matrices are adjacent in the
 * file, else three; the mmap store only hints the kernel with MADV_WILLNEED), read_part one
 * matrix, and cb_read_jobs an acquire's misses on up to CB_EXPERTS_READERS threads at once;
 * cb_read_jobs_start / cb_read_job_wait / cb_read_jobs_join do the same for a started acquire,
 * the reads running while the caller computes. cb_experts_set_read_hook swaps pread for a
 * test's function.
 *
 * Invariant: a reader runs with mu RELEASED on a slot its caller owns (locked by an acquire or
 * loading for the prefetch thread): it reads only immutable tables and writes only that slot's
 * pool bytes, so readers share nothing but the file descriptor. The bookkeeping after a read
 * (cb_account_read, cb_slot_unclaim) is the caller's, under mu.
 *
 * O_DIRECT (cache store, default where the file system takes it): reads bypass the page cache,
 * so the bytes read exist once (in the slot) rather than twice (slot + page cache, which a
 * cgroup memory limit charges and which evicts the dense weights' pages), and the device
 * reads them faster (tools/bench/disk.py on the 2-core VM, 1 MiB random reads: buffered
 * 550-1200 MB/s at queue depth 1-8, O_DIRECT 1365-1657). io_uring at the same queue depth was
 * no faster than these threads there (1239-1564 MB/s), so the readers stay threads. */
#include "colibri/experts.h"

#include "alloc.h"
#include "experts_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *const part_name[3] = {"gate", "up", "down"};

/* one pread (or the test hook) on fd */
static int64_t read_some(const cb_experts_t *s, int fd, uint8_t *dst, size_t len, uint64_t off) {
    return s->read_fn ? s->read_fn(s->read_user, fd, dst, len, off)
                      : (int64_t)pread(fd, dst, len, (off_t)off);
}

/* Reads matrix `part` of expert g (-1: its whole one-read span), len bytes at file offset off,
 * into dst: short reads continue, EINTR is retried, a read error or the end of the file fails
 * with CB_STATUS_IO naming the file, the layer, the expert and the range (mu may be released:
 * touches only dst and the fd; the detail goes to the calling thread's buffer). */
static cb_status pread_all(const cb_experts_t *s, int32_t g, int part, uint8_t *dst, size_t len,
                           uint64_t off) {
    const uint64_t off0 = off;
    const size_t len0 = len;
    while (len > 0) {
        int64_t r = read_some(s, s->fd, dst, len, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || (uint64_t)r > len) {
            int32_t l = s->layer_of[g];
            char why[96];
            if (r == 0)
                snprintf(why, sizeof why, "the file ends before byte %llu (truncated?)",
                         (unsigned long long)off);
            else if (r < 0)
                snprintf(why, sizeof why, "%s", strerror(errno));
            else
                snprintf(why, sizeof why, "the read returned %lld bytes of %zu", (long long)r,
                         len);
            return cb_fail(CB_STATUS_IO,
                           "experts: cannot read expert %d of layer %d from %s (%s, %zu bytes "
                           "at offset %llu): %s", (int)((size_t)g - s->offsets[l]), (int)l,
                           s->path ? s->path : "the model file",
                           part < 0 ? "gate|up|down" : part_name[part], len0,
                           (unsigned long long)off0, why);
        }
        dst += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return CB_OK;
}

/* Reads len bytes at file offset off into a slot region that starts at `region` (aligned),
 * the bytes landing at region + dio_delta(off). With O_DIRECT the read covers the aligned
 * blocks around the range (the slack is in the region); a read the file system refuses
 * (EINVAL: an alignment it does not take), fails, or stops short mid-block is done again
 * whole with buffered reads (no byte of a read sequence that failed is trusted), so the result
 * never depends on the device's whims; an error that persists is reported by pread_all, naming
 * the file, layer, expert and range. */
static cb_status read_range(const cb_experts_t *s, int32_t g, int part, uint8_t *region,
                            size_t len, uint64_t off) {
    if (s->dfd < 0) return pread_all(s, g, part, region, len, off);
    const size_t d = dio_delta(s, off), need = d + len, req = align_up(need, s->dio);
    const uint64_t a0 = off - d;
    size_t got = 0;
    while (got < need) {
        int64_t r = read_some(s, s->dfd, region + got, req - got, a0 + got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || (uint64_t)r > req - got) break;
        got += (size_t)r;
        if (got < need && got % s->dio) break; /* short mid-block: the rest unaligned */
    }
    if (got >= need) return CB_OK;
    return pread_all(s, g, part, region + d, len, off); /* all of it again: trust no part */
}

/* Brings expert g into slot k (cache: read it; mmap: hint it). Runs with mu RELEASED: it only
 * reads immutable tables and writes the slot's pool bytes, which its caller owns. *reads and
 * *bytes receive the pread calls and bytes read. */
cb_status cb_read_expert(const cb_experts_t *s, int32_t k, int32_t g, uint64_t *reads,
                             uint64_t *bytes) {
    uint64_t off[3];
    size_t len[3];
    const uint8_t *addr[3];
    expert_ranges(s, g, off, len, addr);
    const layout_t *y = &s->lay[s->layer_of[g]];
    *reads = 0;
    *bytes = 0;
    if (s->mode == CB_EXPERTS_CACHE) {
        uint8_t *dst = s->pool + (size_t)k * s->slot_bytes;
        if (y->one_read) {
            *reads = 1;
            *bytes = y->span;
            return read_range(s, g, -1, dst, y->span, off[0]);
        }
        for (int i = 0; i < 3; i++) {
            (*reads)++;
            cb_status rs = read_range(s, g, i, dst + y->at[i], len[i], off[i]);
            if (rs != CB_OK) return rs;
            *bytes += len[i];
        }
    } else {
        for (int i = 0; i < 3; i++) advise_inner(s, addr[i], len[i], MADV_WILLNEED);
        *bytes = (uint64_t)len[0] + len[1] + len[2];
    }
    return CB_OK;
}

/* one matrix (part 0 gate, 1 up, 2 down) of g into cache slot k, for the three-read layout */
static cb_status read_part(const cb_experts_t *s, int32_t k, int32_t g, int32_t part,
                           uint64_t *reads, uint64_t *bytes) {
    uint64_t off[3];
    size_t len[3];
    const uint8_t *addr[3];
    expert_ranges(s, g, off, len, addr);
    const layout_t *y = &s->lay[s->layer_of[g]];
    *reads = 1;
    *bytes = len[part];
    return read_range(s, g, part, s->pool + (size_t)k * s->slot_bytes + y->at[part], len[part],
                      off[part]);
}

cb_status cb_read_job(const cb_experts_t *s, read_job_t *x) {
    if (x->part < 0) return cb_read_expert(s, x->k, x->g, &x->reads, &x->bytes);
    return read_part(s, x->k, x->g, x->part, &x->reads, &x->bytes);
}

/* Parallel miss reads: an acquire with several misses claims their slots first (locked, owner
 * set: no one else reads, writes or evicts them), then reads them with mu released on up to
 * CB_EXPERTS_READERS threads (itself and short-lived helpers), so the disk sees several
 * requests at once: a virtio or NVMe device delivers more bandwidth at a queue depth above
 * one. Each job has its own slot, so the reads share nothing but the file descriptor. */
static void *read_worker(void *arg) {
    read_batch_t *b = arg;
    cb_experts_t *s = (cb_experts_t *)b->s;
    for (;;) {
        int32_t j = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (j >= b->n) break;
        read_job_t *x = &b->jobs[j];
        x->rs = cb_read_job(b->s, x);
        if (b->async) pthread_mutex_lock(&s->rmu); /* err is read under it by the waiters */
        if (x->rs != CB_OK && __atomic_exchange_n(&b->failed, 1, __ATOMIC_ACQ_REL) == 0) {
            b->rs = x->rs; /* the detail is thread-local: hand it to the caller */
            snprintf(b->err, sizeof b->err, "%s", cb_last_error());
        }
        if (b->async) {
            x->done = 1;
            pthread_cond_broadcast(&s->rcv);
            pthread_mutex_unlock(&s->rmu);
        }
    }
    return NULL;
}

/* reads every job (mu released); a helper thread that cannot start leaves its share to us.
 * A failure's detail is left in the calling thread's cb_last_error(). */
void cb_read_jobs(const cb_experts_t *s, read_job_t *jobs, int32_t n) {
    read_batch_t b = {.s = s, .jobs = jobs, .n = n, .next = 0, .failed = 0, .rs = CB_OK};
    int started[CB_EXPERTS_READERS - 1] = {0};
    int32_t helpers = n - 1 < CB_EXPERTS_READERS - 1 ? n - 1 : CB_EXPERTS_READERS - 1;
    for (int32_t i = 0; i < helpers; i++)
        started[i] = cb_thread_create(&b.th[i], read_worker, &b) == 0;
    read_worker(&b);
    for (int32_t i = 0; i < helpers; i++)
        if (started[i]) pthread_join(b.th[i], NULL);
    if (b.failed) (void)cb_fail(b.rs, "%s", b.err);
}

/* Overlapped reads (cb_experts_acquire_start): the caller computes while reader threads read,
 * in job order (the acquire's experts in the order asked), each job marked done under rmu. */
void cb_read_jobs_start(cb_experts_t *s, read_job_t *jobs, int32_t n) {
    read_batch_t *b = &s->rb;
    b->s = s;
    b->jobs = jobs;
    b->n = n;
    b->next = 0;
    b->failed = 0;
    b->rs = CB_OK;
    b->err[0] = 0;
    b->async = 1;
    b->n_threads = 0;
    for (int32_t j = 0; j < n; j++) jobs[j].done = 0;
    int32_t want = n < CB_EXPERTS_READERS ? n : CB_EXPERTS_READERS;
    for (int32_t i = 0; i < want; i++) {
        if (cb_thread_create(&b->th[b->n_threads], read_worker, b) != 0) break;
        b->n_threads++;
    }
    if (b->n_threads == 0) read_worker(b); /* no thread: read them now */
}

cb_status cb_read_job_wait(cb_experts_t *s, int32_t j) {
    read_job_t *x = &s->rb.jobs[j];
    char err[sizeof s->rb.err];
    pthread_mutex_lock(&s->rmu);
    while (!x->done) pthread_cond_wait(&s->rcv, &s->rmu);
    if (x->rs != CB_OK) memcpy(err, s->rb.err, sizeof err);
    pthread_mutex_unlock(&s->rmu);
    if (x->rs != CB_OK) return cb_fail(x->rs, "%s", err);
    return CB_OK;
}

void cb_read_jobs_join(cb_experts_t *s) {
    read_batch_t *b = &s->rb;
    for (int32_t i = 0; i < b->n_threads; i++) pthread_join(b->th[i], NULL);
    b->n_threads = 0;
    b->async = 0;
    if (b->failed) (void)cb_fail(b->rs, "%s", b->err);
}

void cb_experts_set_read_hook(cb_experts_t *s, cb_experts_read_fn fn, void *user) {
    if (!s || s->mode == CB_EXPERTS_MAPPED) return;
    pthread_mutex_lock(&s->mu);
    while (s->n_loading > 0) pthread_cond_wait(&s->cv_done, &s->mu); /* no read in flight */
    s->read_fn = fn;
    s->read_user = fn ? user : NULL;
    pthread_mutex_unlock(&s->mu);
}
