/* The KV arena: an mmap'd region and a binary buddy allocator over it (include/colibri/arena.h).
 *
 * Units. The region is n_units units of min_block bytes; everything below counts in units.
 * Side table (allocated once at init, never resized): per unit
 *   state[u]  UNIT_NONE (interior of a block, or not a block start), UNIT_FREE (head of a free
 *             buddy block), UNIT_USED (head of a live allocation)
 *   order[u]  order k of the free buddy block starting at u (2^k units)
 *   meta[u]   free head: next/prev of its order's free list; used head: requested bytes.
 * A live allocation of requested n bytes covers m = run_units(n) units: ceil(n/min_block)
 * (exact mode) or that rounded up to a power of two; m is recomputed from n, never stored.
 *
 * Invariants (cb_arena_check verifies them all):
 *   - every unit belongs to exactly one block (free or used); heads tile [0, n_units);
 *   - a free block of order k starts at a multiple of 2^k and lies inside one root;
 *   - a used block of m units starts at a multiple of 2^max(0, floor(log2 m) - ALIGN_SLACK)
 *     units in exact mode (at most 1/32 of its size), of m (its size) in classic mode;
 *   - no free block has a free buddy of the same order (coalescing is complete), so the set of
 *     free blocks is the unique maximal buddy decomposition of the free units;
 *   - free list k holds exactly the free heads of order k; bit k of nonempty <=> list k non-empty;
 *   - used_units, n_blocks, requested, n_free_blocks equal a recount; used + free == capacity.
 * Because the free decomposition is unique, undoing an operation (free then carve back) restores
 * exactly the previous state, which is how a failed grow leaves the arena unchanged.
 *
 * Ownership: the arena owns the mapping and the side table. The mutex guards all of it; pins
 * (cb_arena_view) keep the mapping alive after cb_arena_close until the last cb_arena_unpin.
 *
 * Files: this file is the allocator and the mapping; the KV cache that keeps each sequence in one
 * block (the rest of arena.h) is kvcache.c, a client of the public API above only.
 */
#include "colibri/arena.h"

#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define NIL UINT32_MAX
#define MAX_ORDER 31 /* n_units <= 2^31 */
#define UNIT_NONE 0
#define UNIT_FREE 1
#define UNIT_USED 2
#define THP_ALIGN ((size_t)2 << 20)

typedef union unit_meta {
    struct {
        uint32_t next, prev;
    } link;
    uint64_t requested;
} unit_meta;

struct cb_arena {
    pthread_mutex_t mu;
    uint8_t *base; /* mapping start (NULL once unmapped) */
    size_t mapped; /* bytes mapped */
    size_t capacity;
    size_t min_block;
    unsigned shift; /* log2(min_block) */
    uint32_t n_units;
    int exact, locked, closed;
    size_t pins;
    size_t n_roots;
    uint8_t *state, *order;
    unit_meta *meta;
    uint32_t head[MAX_ORDER + 1];
    size_t nfree[MAX_ORDER + 1];
    uint64_t nonempty;
    size_t used_units, n_blocks, n_free_blocks;
    uint64_t requested;
    const char *backing;
    char note[768];
};

/* ---------------------------------------------------------------------------- small helpers */

static unsigned ceil_log2_u32(uint32_t m) { return m <= 1 ? 0 : 32u - (unsigned)__builtin_clz(m - 1); }
static unsigned floor_log2_u32(uint32_t m) { return 31u - (unsigned)__builtin_clz(m); }

/* Units covered by a live block of n requested bytes (1 <= n <= capacity). */
static uint32_t run_units(const cb_arena_t *a, uint64_t n) {
    uint32_t m = (uint32_t)((n + a->min_block - 1) >> a->shift);
    if (!a->exact) m = 1u << ceil_log2_u32(m);
    return m;
}

static void list_push(cb_arena_t *a, uint32_t u, unsigned k) {
    a->state[u] = UNIT_FREE;
    a->order[u] = (uint8_t)k;
    a->meta[u].link.next = a->head[k];
    a->meta[u].link.prev = NIL;
    if (a->head[k] != NIL) a->meta[a->head[k]].link.prev = u;
    a->head[k] = u;
    a->nonempty |= (uint64_t)1 << k;
    a->nfree[k]++;
    a->n_free_blocks++;
}

static void list_remove(cb_arena_t *a, uint32_t u) {
    unsigned k = a->order[u];
    uint32_t n = a->meta[u].link.next, p = a->meta[u].link.prev;
    if (p != NIL) a->meta[p].link.next = n; else a->head[k] = n;
    if (n != NIL) a->meta[n].link.prev = p;
    if (a->head[k] == NIL) a->nonempty &= ~((uint64_t)1 << k);
    a->nfree[k]--;
    a->n_free_blocks--;
    a->state[u] = UNIT_NONE;
}

/* Returns the aligned piece (u, k) to the free lists, merging with free buddies. */
static void free_piece(cb_arena_t *a, uint32_t u, unsigned k) {
    while (k < MAX_ORDER) {
        uint64_t b = (uint64_t)u ^ ((uint64_t)1 << k);
        if (b + ((uint64_t)1 << k) > a->n_units) break;
        if (a->state[b] != UNIT_FREE || a->order[b] != k) break;
        list_remove(a, (uint32_t)b);
        if (b < u) u = (uint32_t)b;
        k++;
    }
    list_push(a, u, k);
}

/* Head of the free block containing the aligned piece (p, j), or NIL when the piece is not
 * entirely free (with complete coalescing a wholly free aligned piece lies in one free block). */
static uint32_t containing_free(const cb_arena_t *a, uint32_t p, unsigned j) {
    for (unsigned i = j; i <= MAX_ORDER; i++) {
        uint32_t h = (uint32_t)((uint64_t)p & ~(((uint64_t)1 << i) - 1));
        if (a->state[h] == UNIT_FREE && a->order[h] == i) return h;
    }
    return NIL;
}

/* Takes the wholly free aligned piece (p, j) out of the free lists (splitting its container). */
static void carve_piece(cb_arena_t *a, uint32_t p, unsigned j) {
    uint32_t h = containing_free(a, p, j);
    unsigned i = a->order[h];
    list_remove(a, h);
    while (i > j) {
        i--;
        uint32_t half = 1u << i;
        if (p >= h + half) {
            list_push(a, h, i);
            h += half;
        } else {
            list_push(a, h + half, i);
        }
    }
}

/* Next aligned piece of the range [p, e): its order. */
static unsigned piece_order(uint32_t p, uint32_t e) {
    unsigned j = floor_log2_u32(e - p);
    if (p != 0) {
        unsigned t = (unsigned)__builtin_ctz(p);
        if (t < j) j = t;
    }
    return j;
}

static void free_range(cb_arena_t *a, uint32_t s, uint32_t e) {
    while (s < e) {
        unsigned j = piece_order(s, e);
        free_piece(a, s, j);
        s += 1u << j;
    }
}

static int range_is_free(const cb_arena_t *a, uint32_t s, uint32_t e) {
    while (s < e) {
        unsigned j = piece_order(s, e);
        if (containing_free(a, s, j) == NIL) return 0;
        s += 1u << j;
    }
    return 1;
}

static void carve_range(cb_arena_t *a, uint32_t s, uint32_t e) {
    while (s < e) {
        unsigned j = piece_order(s, e);
        carve_piece(a, s, j);
        s += 1u << j;
    }
}

/* Candidates per free list looked at by take_run before it splits a larger block (a
 * constant, so take_run stays O(log^2 n)). */
#define FIT_SCAN 16

/* Exact mode: a run of m units starts at a multiple of 2^max(0, floor(log2 m) - ALIGN_SLACK)
 * units, at most 1/32 of its size. Runs of one size then pack back to back with a gap of less
 * than 1/32 of a run between them (a KV block of 144 units - 16 tokens of 36 KiB in 4 KiB units
 * - packs with no gap at all); aligned to 2^floor(log2 m), as before, the next one could only
 * start 256 units further on: 56% of the arena held. The run is still made of buddy blocks
 * (piece_order cuts any range into aligned pieces), so the free decomposition stays the unique
 * maximal one. */
#define ALIGN_SLACK 5

/* log2 of the alignment (in units) of a run of m units; classic mode: its size. */
static unsigned run_align_log2(const cb_arena_t *a, uint32_t m) {
    unsigned f = floor_log2_u32(m);
    if (!a->exact) return f;
    return f > ALIGN_SLACK ? f - ALIGN_SLACK : 0;
}

/* Takes a run of m units; NIL when none fits. The run starts at a multiple of
 * 2^run_align_log2(m). In exact mode it first looks, through the free lists from the smallest
 * order that is aligned enough up to floor(log2 m) (below 2^ceil(log2 m)), for a free block
 * followed by enough free units: the small blocks at the start of a free stretch come first,
 * so runs pack against their neighbours and larger blocks stay whole for later. Else it takes
 * the smallest free block of order >= ceil(log2 m), splits it down and, in exact mode, frees
 * the unused tail again. */
static uint32_t take_run(cb_arena_t *a, uint32_t m) {
    unsigned k = ceil_log2_u32(m), f = floor_log2_u32(m);
    if (a->exact) {
        for (unsigned o = run_align_log2(a, m); o <= f && o < k; o++) {
            if (!((a->nonempty >> o) & 1)) continue;
            unsigned scanned = 0;
            for (uint32_t h = a->head[o]; h != NIL && scanned < FIT_SCAN; h = a->meta[h].link.next, scanned++) {
                if ((uint64_t)h + m <= a->n_units && range_is_free(a, h + (1u << o), h + m)) {
                    list_remove(a, h);
                    carve_range(a, h + (1u << o), h + m);
                    return h;
                }
            }
        }
    }
    uint64_t avail = a->nonempty >> k;
    if (avail == 0) return NIL;
    unsigned j = k + (unsigned)__builtin_ctzll(avail);
    uint32_t h = a->head[j];
    list_remove(a, h);
    while (j > k) {
        j--;
        list_push(a, h + (1u << j), j);
    }
    if (m < (1u << k)) free_range(a, h + m, h + (1u << k));
    return h;
}

static size_t largest_free_bytes(const cb_arena_t *a) {
    if (a->nonempty == 0) return 0;
    return a->min_block << (63 - __builtin_clzll(a->nonempty));
}

static cb_status fail_oom(const cb_arena_t *a, const char *what, size_t n) {
    return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                   "arena: cannot %s %zu bytes: the largest free block is %zu bytes (%zu of %zu "
                   "bytes free in %zu free blocks)",
                   what, n, largest_free_bytes(a), a->capacity - (a->used_units << a->shift),
                   a->capacity, a->n_free_blocks);
}

/* Head unit of the live block starting at byte offset off, or a failure status. */
static cb_status live_head(const cb_arena_t *a, size_t off, uint32_t *u) {
    if (off % a->min_block != 0 || off >= a->capacity)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "arena: offset %zu is not a live block (%s)", off,
                       off >= a->capacity ? "outside the arena" : "not a multiple of min_block");
    uint32_t h = (uint32_t)(off >> a->shift);
    if (a->state[h] == UNIT_USED) {
        *u = h;
        return CB_OK;
    }
    if (a->state[h] == UNIT_FREE)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "arena: offset %zu is not a live block (it is free: double free?)", off);
    return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                   "arena: offset %zu is not a live block (it is inside another block)", off);
}

/* ------------------------------------------------------------------------------- mapping */

static long long meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
            v = strtoll(line + kl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

/* The bracketed word of a THP sysfs file ("madvise"), or "" when unreadable. */
static void thp_mode(const char *path, char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[256];
    if (fgets(line, sizeof line, f)) {
        char *l = strchr(line, '['), *r = l ? strchr(l, ']') : NULL;
        if (l && r && (size_t)(r - l - 1) < cap) {
            memcpy(out, l + 1, (size_t)(r - l - 1));
            out[r - l - 1] = '\0';
        }
    }
    fclose(f);
}

static void note_add(cb_arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_add(cb_arena_t *a, const char *fmt, ...) {
    size_t len = strlen(a->note);
    if (len + 3 >= sizeof a->note) return;
    if (len) {
        memcpy(a->note + len, "; ", 3);
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->note + len, sizeof a->note - len, fmt, ap);
    va_end(ap);
}

/* Anonymous mapping of len bytes aligned to 2 MiB (so THP can back it); NULL on failure. */
static uint8_t *map_aligned(size_t len) {
    size_t total = len + THP_ALIGN;
    uint8_t *p = cb_mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uintptr_t start = ((uintptr_t)p + THP_ALIGN - 1) & ~(uintptr_t)(THP_ALIGN - 1);
    size_t head = start - (uintptr_t)p, tail = total - head - len;
    if (head) munmap(p, head);
    if (tail) munmap((uint8_t *)start + len, tail);
    return (uint8_t *)start;
}

static cb_status map_shm(cb_arena_t *a, const cb_arena_params *pr) {
    if (pr->hugepages == CB_HUGEPAGES_ON)
        return cb_fail(CB_STATUS_UNSUPPORTED,
                       "arena: hugepages='on' (MAP_HUGETLB) is not available with backing='shm': "
                       "/dev/shm is tmpfs; use hugepages='auto' (transparent huge pages when "
                       "shmem_enabled allows) or backing='anon'");
    char path[] = "/dev/shm/colibri-arena-XXXXXX";
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0)
        return cb_fail(CB_STATUS_IO, "arena: cannot create a file in /dev/shm: %s", strerror(errno));
    unlink(path);
    if (ftruncate(fd, (off_t)a->capacity) != 0) {
        int e = errno;
        close(fd);
        return cb_fail(CB_STATUS_IO, "arena: cannot size the /dev/shm file to %zu bytes: %s",
                       a->capacity, strerror(e));
    }
    /* Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS later. */
    int e = posix_fallocate(fd, 0, (off_t)a->capacity);
    if (e != 0) {
        close(fd);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                       "arena: cannot reserve %zu bytes in /dev/shm: %s (see `df -h /dev/shm`)",
                       a->capacity, strerror(e));
    }
    void *p = cb_mmap(NULL, a->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY, "arena: mmap of %zu bytes of /dev/shm failed: %s",
                       a->capacity, strerror(e));
    a->base = p;
    a->mapped = a->capacity;
    a->backing = "shm";
    if (pr->hugepages == CB_HUGEPAGES_AUTO) {
        char mode[32];
        thp_mode("/sys/kernel/mm/transparent_hugepage/shmem_enabled", mode, sizeof mode);
        if (mode[0] == '\0' || strcmp(mode, "never") == 0 || strcmp(mode, "deny") == 0) {
            note_add(a, "no huge pages for /dev/shm: transparent huge pages for shared memory are "
                        "'%s' (/sys/kernel/mm/transparent_hugepage/shmem_enabled); plain pages",
                     mode[0] ? mode : "unavailable");
        } else if (madvise(p, a->capacity, MADV_HUGEPAGE) == 0) {
            a->backing = "shm+thp";
        } else {
            note_add(a, "madvise(MADV_HUGEPAGE) on /dev/shm failed: %s; plain pages",
                     strerror(errno));
        }
    }
    return CB_OK;
}

static cb_status map_anon(cb_arena_t *a, const cb_arena_params *pr) {
    if (pr->hugepages != CB_HUGEPAGES_OFF) {
        long long hp_kb = meminfo_kb("Hugepagesize"), hp_free = meminfo_kb("HugePages_Free");
        size_t hp = hp_kb > 0 ? (size_t)hp_kb * 1024 : THP_ALIGN;
        size_t need = (a->capacity + hp - 1) / hp;
        if (hp_free >= 0 && (size_t)hp_free >= need) {
            void *p = cb_mmap(NULL, need * hp, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
            if (p != MAP_FAILED) {
                a->base = p;
                a->mapped = need * hp;
                a->backing = "hugetlb";
                return CB_OK;
            }
            note_add(a, "MAP_HUGETLB mmap of %zu huge pages failed: %s", need, strerror(errno));
        } else {
            note_add(a,
                     "no hugetlb pages: %zu huge pages of %zu KiB needed, HugePages_Free is %lld "
                     "(/proc/meminfo); reserve them with `sudo sysctl -w vm.nr_hugepages=%zu`",
                     need, hp / 1024, hp_free, need);
        }
        if (pr->hugepages == CB_HUGEPAGES_ON)
            return cb_fail(CB_STATUS_UNSUPPORTED, "arena: hugepages='on' failed: %s "
                           "(or use hugepages='auto' to fall back)", a->note);
    }
    uint8_t *p = map_aligned(a->capacity);
    if (!p)
        return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                       "arena: mmap of %zu bytes failed: %s (the arena's capacity is committed "
                       "up front: see free memory and vm.overcommit_memory)",
                       a->capacity, strerror(errno));
    a->base = p;
    a->mapped = a->capacity;
    a->backing = "pages";
    if (pr->hugepages == CB_HUGEPAGES_AUTO) {
        char mode[32];
        thp_mode("/sys/kernel/mm/transparent_hugepage/enabled", mode, sizeof mode);
        if (strcmp(mode, "never") == 0) {
            note_add(a, "transparent huge pages are disabled ('never' in "
                        "/sys/kernel/mm/transparent_hugepage/enabled); plain pages");
        } else if (madvise(p, a->capacity, MADV_HUGEPAGE) == 0) {
            a->backing = "thp";
            note_add(a, "falling back to transparent huge pages (madvise)");
        } else {
            note_add(a, "madvise(MADV_HUGEPAGE) failed: %s; plain pages", strerror(errno));
        }
    }
    return CB_OK;
}

static void unmap(cb_arena_t *a) {
    if (a->base) {
        munmap(a->base, a->mapped);
        a->base = NULL;
    }
}

/* ---------------------------------------------------------------------------------- API */

cb_arena_params cb_arena_default_params(void) {
    cb_arena_params p;
    memset(&p, 0, sizeof p);
    p.min_block = 4096;
    p.hugepages = CB_HUGEPAGES_AUTO;
    p.backing = CB_BACKING_ANON;
    p.exact = 1;
    return p;
}

static void release_tables(cb_arena_t *a) {
    free(a->state);
    free(a->order);
    free(a->meta);
    a->state = a->order = NULL;
    a->meta = NULL;
}

cb_status cb_arena_new(const cb_arena_params *pr, cb_arena_t **out) {
    if (!pr || !out) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: params and out must not be NULL");
    *out = NULL;
    size_t mb = pr->min_block;
    if (mb < 64 || (mb & (mb - 1)) != 0 || mb > ((size_t)1 << 30))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "arena: min_block %zu must be a power of two between 64 and 2^30", mb);
    if (pr->capacity == 0)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: capacity must be > 0");
    if (pr->hugepages < CB_HUGEPAGES_AUTO || pr->hugepages > CB_HUGEPAGES_ON)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: unknown hugepages mode %d", (int)pr->hugepages);
    if (pr->backing != CB_BACKING_ANON && pr->backing != CB_BACKING_SHM)
        return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: unknown backing %d", (int)pr->backing);
    size_t units = pr->capacity / mb + (pr->capacity % mb != 0);
    if (units > ((size_t)1 << MAX_ORDER))
        return cb_fail(CB_STATUS_INVALID_ARGUMENT,
                       "arena: capacity %zu is %zu blocks of min_block %zu; at most 2^31 are "
                       "supported: use a larger min_block", pr->capacity, units, mb);
    cb_arena_t *a = cb_calloc(1, sizeof *a);
    if (!a) return cb_fail(CB_STATUS_OUT_OF_MEMORY, "arena: cannot allocate the handle");
    a->min_block = mb;
    a->shift = (unsigned)__builtin_ctzll(mb);
    a->n_units = (uint32_t)units;
    a->capacity = units * mb;
    a->exact = pr->exact != 0;
    a->state = cb_calloc(units, 1);
    a->order = cb_calloc(units, 1);
    a->meta = cb_calloc(units, sizeof *a->meta);
    if (!a->state || !a->order || !a->meta) {
        release_tables(a);
        free(a);
        return cb_fail(CB_STATUS_OUT_OF_MEMORY,
                       "arena: cannot allocate the %zu-byte side table for %zu blocks",
                       units * (2 + sizeof(unit_meta)), units);
    }
    cb_status s = pr->backing == CB_BACKING_SHM ? map_shm(a, pr) : map_anon(a, pr);
    if (s == CB_OK && pr->lock) {
        if (mlock(a->base, a->mapped) == 0) {
            a->locked = 1;
        } else {
            int e = errno;
            struct rlimit rl;
            char lim[64] = "unknown";
            if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
                if (rl.rlim_cur == RLIM_INFINITY) snprintf(lim, sizeof lim, "unlimited");
                else snprintf(lim, sizeof lim, "%llu bytes", (unsigned long long)rl.rlim_cur);
            }
            unmap(a);
            s = cb_fail(CB_STATUS_OUT_OF_MEMORY,
                        "arena: mlock of %zu bytes failed (%s): RLIMIT_MEMLOCK is %s; raise it "
                        "with `ulimit -l unlimited` (or memlock in /etc/security/limits.conf), or "
                        "use lock=False", a->mapped, strerror(e), lim);
        }
    }
    if (s != CB_OK) {
        unmap(a);
        release_tables(a);
        free(a);
        return s;
    }
    for (unsigned k = 0; k <= MAX_ORDER; k++) a->head[k] = NIL;
    uint32_t at = 0;
    for (int k = MAX_ORDER; k >= 0; k--) {
        if (a->n_units & ((uint64_t)1 << k)) {
            list_push(a, at, (unsigned)k);
            at += 1u << k;
            a->n_roots++;
        }
    }
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return CB_OK;
}

static void close_locked(cb_arena_t *a, int force) {
    if (!a->closed) {
        a->closed = 1;
        release_tables(a);
    }
    if (force || a->pins == 0) unmap(a);
}

void cb_arena_close(cb_arena_t *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    close_locked(a, 0);
    pthread_mutex_unlock(&a->mu);
}

void cb_arena_free(cb_arena_t *a) {
    if (!a) return;
    close_locked(a, 1);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void cb_arena_unpin(cb_arena_t *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    if (a->pins) a->pins--;
    if (a->closed && a->pins == 0) unmap(a);
    pthread_mutex_unlock(&a->mu);
}

uint8_t *cb_arena_base(const cb_arena_t *a) { return a && !a->closed ? a->base : NULL; }

/* Head of the block (free or used) holding unit u: blocks tile the units and only heads are
 * marked, so it is the nearest marked unit at or below u. */
static uint32_t block_head(const cb_arena_t *a, uint32_t u) {
    while (u > 0 && a->state[u] == UNIT_NONE) u--;
    return u;
}

#define LOCK_OPEN(a)                                                                   \
    do {                                                                               \
        if (!(a)) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: NULL handle");    \
        pthread_mutex_lock(&(a)->mu);                                                  \
        if ((a)->closed) {                                                             \
            pthread_mutex_unlock(&(a)->mu);                                            \
            return cb_fail(CB_STATUS_CLOSED, "arena: the arena is closed");            \
        }                                                                              \
    } while (0)

#define RETURN_UNLOCK(a, expr)             \
    do {                                   \
        cb_status rs_ = (expr);            \
        pthread_mutex_unlock(&(a)->mu);    \
        return rs_;                        \
    } while (0)

cb_status cb_arena_alloc(cb_arena_t *a, size_t n, size_t *offset) {
    if (!offset) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: offset must not be NULL");
    LOCK_OPEN(a);
    if (n == 0) RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: cannot allocate 0 bytes"));
    if (n > a->capacity) RETURN_UNLOCK(a, fail_oom(a, "allocate", n));
    uint32_t m = run_units(a, n);
    uint32_t u = take_run(a, m);
    if (u == NIL) RETURN_UNLOCK(a, fail_oom(a, "allocate", n));
    a->state[u] = UNIT_USED;
    a->meta[u].requested = n;
    a->used_units += m;
    a->n_blocks++;
    a->requested += n;
    *offset = (size_t)u << a->shift;
    RETURN_UNLOCK(a, CB_OK);
}

cb_status cb_arena_free_block(cb_arena_t *a, size_t offset) {
    LOCK_OPEN(a);
    uint32_t u = 0;
    cb_status s = live_head(a, offset, &u);
    if (s != CB_OK) RETURN_UNLOCK(a, s);
    uint64_t n = a->meta[u].requested;
    uint32_t m = run_units(a, n);
    a->state[u] = UNIT_NONE;
    free_range(a, u, u + m);
    a->used_units -= m;
    a->n_blocks--;
    a->requested -= n;
    RETURN_UNLOCK(a, CB_OK);
}

static void set_used(cb_arena_t *a, uint32_t u, uint64_t n) {
    a->state[u] = UNIT_USED;
    a->meta[u].requested = n;
}

cb_status cb_arena_grow(cb_arena_t *a, size_t offset, size_t n, size_t *new_offset) {
    if (!new_offset) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: new_offset must not be NULL");
    LOCK_OPEN(a);
    uint32_t u = 0;
    cb_status s = live_head(a, offset, &u);
    if (s != CB_OK) RETURN_UNLOCK(a, s);
    if (n == 0) RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: cannot grow a block to 0 bytes"));
    if (n > a->capacity) RETURN_UNLOCK(a, fail_oom(a, "grow a block to", n));
    uint64_t old_n = a->meta[u].requested;
    uint32_t m_old = run_units(a, old_n), m_new = run_units(a, n);
    if (m_new <= m_old) { /* same block or shrink in place */
        if (m_new < m_old) free_range(a, u + m_new, u + m_old);
        a->used_units -= m_old - m_new;
        a->requested = a->requested - old_n + n;
        a->meta[u].requested = n;
        *new_offset = offset;
        RETURN_UNLOCK(a, CB_OK);
    }
    uint32_t align = 1u << run_align_log2(a, m_new);
    size_t keep = old_n < n ? (size_t)old_n : n;
    if (u % align == 0 && (uint64_t)u + m_new <= a->n_units && range_is_free(a, u + m_old, u + m_new)) {
        carve_range(a, u + m_old, u + m_new); /* in place */
        a->used_units += m_new - m_old;
        a->requested = a->requested - old_n + n;
        a->meta[u].requested = n;
        *new_offset = offset;
        RETURN_UNLOCK(a, CB_OK);
    }
    uint32_t v = take_run(a, m_new); /* elsewhere, the old block still held */
    if (v == NIL) {
        /* Return the old block first, so the new one may overlap it. */
        a->state[u] = UNIT_NONE;
        free_range(a, u, u + m_old);
        v = take_run(a, m_new);
        if (v == NIL) { /* undo: the free decomposition is unique, so this restores the state */
            carve_range(a, u, u + m_old);
            set_used(a, u, old_n);
            RETURN_UNLOCK(a, fail_oom(a, "grow a block to", n));
        }
        memmove(a->base + ((size_t)v << a->shift), a->base + offset, keep);
    } else {
        memcpy(a->base + ((size_t)v << a->shift), a->base + offset, keep);
        a->state[u] = UNIT_NONE;
        free_range(a, u, u + m_old);
    }
    set_used(a, v, n);
    a->used_units += m_new - m_old;
    a->requested = a->requested - old_n + n;
    *new_offset = (size_t)v << a->shift;
    RETURN_UNLOCK(a, CB_OK);
}

cb_status cb_arena_block_info(cb_arena_t *a, size_t offset, size_t *requested, size_t *block) {
    LOCK_OPEN(a);
    uint32_t u = 0;
    cb_status s = live_head(a, offset, &u);
    if (s != CB_OK) RETURN_UNLOCK(a, s);
    if (requested) *requested = (size_t)a->meta[u].requested;
    if (block) *block = (size_t)run_units(a, a->meta[u].requested) << a->shift;
    RETURN_UNLOCK(a, CB_OK);
}

cb_status cb_arena_view(cb_arena_t *a, size_t offset, size_t n, void **ptr) {
    if (!ptr) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: ptr must not be NULL");
    LOCK_OPEN(a);
    if (offset >= a->capacity)
        RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT,
                                 "arena: view at offset %zu is outside the arena (%zu bytes)",
                                 offset, a->capacity));
    uint32_t uo = (uint32_t)(offset >> a->shift);
    /* A backward scan of the side table, O(units of that block) bytes: a run's start is only
     * aligned to 1/32 of its size, so it cannot be computed from uo. */
    uint32_t h = block_head(a, uo);
    if (a->state[h] == UNIT_USED) {
        uint64_t req = a->meta[h].requested;
        size_t start = (size_t)h << a->shift;
        if ((uint64_t)h + run_units(a, req) > uo) {
            if (offset - start > req || n > req - (offset - start))
                RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT,
                                         "arena: view [%zu, %zu) is not inside the live block at "
                                         "%zu of %llu requested bytes", offset, offset + n, start,
                                         (unsigned long long)req));
            a->pins++;
            *ptr = a->base + offset;
            RETURN_UNLOCK(a, CB_OK);
        }
    }
    RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT,
                             "arena: view at offset %zu is not inside a live block", offset));
}

cb_status cb_arena_stats(cb_arena_t *a, cb_arena_stats_t *st) {
    if (!st) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: stats must not be NULL");
    LOCK_OPEN(a);
    memset(st, 0, sizeof *st);
    st->capacity = a->capacity;
    st->used = a->used_units << a->shift;
    st->free = a->capacity - st->used;
    st->largest_free = largest_free_bytes(a);
    st->n_blocks = a->n_blocks;
    st->n_free_blocks = a->n_free_blocks;
    st->requested = (size_t)a->requested;
    st->internal_waste = st->used - st->requested;
    st->external_fragmentation = st->free ? 1.0 - (double)st->largest_free / (double)st->free : 0.0;
    st->min_block = a->min_block;
    st->n_roots = a->n_roots;
    st->mapped = a->mapped;
    st->exact = a->exact;
    st->locked = a->locked;
    st->backing = a->backing;
    st->backing_note = a->note;
    RETURN_UNLOCK(a, CB_OK);
}

#define BROKEN(...) RETURN_UNLOCK(a, cb_fail(CB_STATUS_INTERNAL, "arena check: " __VA_ARGS__))

cb_status cb_arena_compact(cb_arena_t *a, size_t *offsets, size_t n, int up) {
    if (n && !offsets) return cb_fail(CB_STATUS_INVALID_ARGUMENT, "arena: offsets must not be NULL");
    LOCK_OPEN(a);
    for (size_t i = 0; i < n; i++) { /* validate everything before moving anything */
        uint32_t u;
        cb_status s = live_head(a, offsets[i], &u);
        if (s != CB_OK) RETURN_UNLOCK(a, s);
        if (i > 0 && offsets[i] <= offsets[i - 1])
            RETURN_UNLOCK(a, cb_fail(CB_STATUS_INVALID_ARGUMENT,
                                     "arena: compact needs increasing offsets (%zu after %zu)",
                                     offsets[i], offsets[i - 1]));
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = up ? n - 1 - k : k;
        uint32_t u = (uint32_t)(offsets[i] >> a->shift);
        uint64_t req = a->meta[u].requested;
        uint32_t m = run_units(a, req), g = 1u << run_align_log2(a, m), s;
        if (up) {
            uint32_t e = u + m; /* end of the free stretch that starts after the block */
            while (e < a->n_units && a->state[e] == UNIT_FREE) e += 1u << a->order[e];
            s = (e - m) / g * g;
            if (s <= u) continue;
        } else {
            uint32_t p = u; /* start of the free stretch that ends at u */
            while (p > 0) {
                uint32_t h = block_head(a, p - 1);
                if (a->state[h] != UNIT_FREE) break;
                p = h;
            }
            s = (p + g - 1) / g * g;
            if (s >= u) continue;
        }
        a->state[u] = UNIT_NONE;
        free_range(a, u, u + m);
        carve_range(a, s, s + m); /* inside the stretch and the block's own units, all free now */
        memmove(a->base + ((size_t)s << a->shift), a->base + offsets[i], (size_t)req);
        set_used(a, s, req);
        offsets[i] = (size_t)s << a->shift;
    }
    RETURN_UNLOCK(a, CB_OK);
}

cb_status cb_arena_check(cb_arena_t *a) {
    LOCK_OPEN(a);
    size_t used = 0, blocks = 0, free_units = 0, free_blocks = 0;
    uint64_t req = 0;
    size_t nfree[MAX_ORDER + 1] = {0};
    uint64_t root_start = 0; /* roots: one per set bit of n_units, largest first */
    int root_bit = MAX_ORDER;
    uint64_t u = 0;
    while (u < a->n_units) {
        while (!(a->n_units & ((uint64_t)1 << root_bit)) || u >= root_start + ((uint64_t)1 << root_bit)) {
            if (a->n_units & ((uint64_t)1 << root_bit)) root_start += (uint64_t)1 << root_bit;
            root_bit--;
        }
        uint64_t size;
        if (a->state[u] == UNIT_USED) {
            uint64_t n = a->meta[u].requested;
            if (n == 0 || n > a->capacity) BROKEN("used block at unit %llu has requested size %llu", (unsigned long long)u, (unsigned long long)n);
            size = run_units(a, n);
            uint64_t align = (uint64_t)1 << run_align_log2(a, (uint32_t)size);
            if (u % align) BROKEN("used block at unit %llu of %llu units is not aligned to %llu", (unsigned long long)u, (unsigned long long)size, (unsigned long long)align);
            used += size;
            blocks++;
            req += n;
        } else if (a->state[u] == UNIT_FREE) {
            unsigned k = a->order[u];
            if (k > MAX_ORDER) BROKEN("free block at unit %llu has order %u", (unsigned long long)u, k);
            size = (uint64_t)1 << k;
            if (u % size) BROKEN("free block at unit %llu of order %u is not aligned", (unsigned long long)u, k);
            if (u + size > root_start + ((uint64_t)1 << root_bit)) BROKEN("free block at unit %llu of order %u crosses its root", (unsigned long long)u, k);
            uint64_t b = u ^ size;
            if (b + size <= a->n_units && a->state[b] == UNIT_FREE && a->order[b] == k)
                BROKEN("free blocks at units %llu and %llu are buddies of order %u (not coalesced)", (unsigned long long)u, (unsigned long long)b, k);
            free_units += size;
            free_blocks++;
            nfree[k]++;
        } else {
            BROKEN("unit %llu is not covered by any block", (unsigned long long)u);
        }
        if (u + size > a->n_units) BROKEN("block at unit %llu of %llu units ends outside the arena", (unsigned long long)u, (unsigned long long)size);
        for (uint64_t i = u + 1; i < u + size; i++)
            if (a->state[i] != UNIT_NONE) BROKEN("block at unit %llu overlaps the block at unit %llu", (unsigned long long)u, (unsigned long long)i);
        u += size;
    }
    for (unsigned k = 0; k <= MAX_ORDER; k++) {
        size_t count = 0;
        uint32_t prev = NIL;
        for (uint32_t h = a->head[k]; h != NIL; h = a->meta[h].link.next) {
            if (h >= a->n_units || count > a->n_units) BROKEN("free list %u is corrupt", k);
            if (a->state[h] != UNIT_FREE || a->order[h] != k) BROKEN("free list %u holds unit %u which is not a free block of order %u", k, h, k);
            if (a->meta[h].link.prev != prev) BROKEN("free list %u: back link of unit %u is wrong", k, h);
            prev = h;
            count++;
        }
        if (count != nfree[k] || count != a->nfree[k]) BROKEN("free list %u has %zu entries, %zu free blocks of that order exist, counter says %zu", k, count, nfree[k], a->nfree[k]);
        if (((a->nonempty >> k) & 1) != (count != 0)) BROKEN("non-empty mask bit %u is wrong", k);
    }
    if (used != a->used_units || blocks != a->n_blocks || req != a->requested || free_blocks != a->n_free_blocks)
        BROKEN("counters disagree with a recount (used %zu/%zu units, blocks %zu/%zu, requested %llu/%llu, free blocks %zu/%zu)", used, a->used_units, blocks, a->n_blocks, (unsigned long long)req, (unsigned long long)a->requested, free_blocks, a->n_free_blocks);
    if (used + free_units != a->n_units) BROKEN("used %zu + free %zu units != %u", used, free_units, a->n_units);
    RETURN_UNLOCK(a, CB_OK);
}
