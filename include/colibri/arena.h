/* The KV arena: one contiguous mmap'd region managed by a binary buddy allocator, and the
 * KV cache that keeps each sequence's K/V in one block of it.
 *
 * Region. mmap'd once at cb_arena_new: 2 MiB MAP_HUGETLB pages when /proc/meminfo shows
 * enough free ones (hugepages AUTO or ON), else anonymous pages with madvise(MADV_HUGEPAGE)
 * (transparent huge pages, when the kernel's THP mode is not "never"), else plain pages.
 * backing SHM maps an unlinked file in /dev/shm instead (THP advised when possible). lock
 * mlock()s the whole region. Which backing the arena got is cb_arena_stats_t.backing; any
 * fallback is explained in cb_arena_stats_t.backing_note. ON fails (CB_STATUS_UNSUPPORTED)
 * instead of falling back; a failed mlock fails with CB_STATUS_OUT_OF_MEMORY naming
 * RLIMIT_MEMLOCK and `ulimit -l`.
 *
 * Capacity. The capacity asked for is rounded UP to a multiple of min_block (a power of two,
 * >= 64 bytes). The region is then covered by "roots": one maximal buddy block per set bit of
 * capacity/min_block, largest first, each aligned to its size (so a power-of-two capacity is a
 * single root and any other capacity is still fully usable). Freeing everything coalesces back
 * to exactly these roots.
 *
 * Allocation. Sizes are in bytes; offsets are byte offsets from the region base. A request of
 * n bytes takes m = ceil(n / min_block) units. In the default EXACT mode (like Linux's
 * alloc_pages_exact()) a block is a run of exactly m units made of buddy blocks, so internal
 * waste is < min_block per allocation instead of up to 50%: the allocator first looks (among
 * a bounded number of candidates per free list, small blocks first) for a free buddy block
 * followed by enough free units, else takes the smallest free block of 2^ceil(log2 m) or more
 * units, splits it down and returns the unused tail to the free lists. In exact mode a block
 * of m units starts at a multiple of 2^max(0, floor(log2 m) - 5) units - at most 1/32 of its
 * size - so blocks of one size pack back to back (aligned to 2^floor(log2 m), 144-unit blocks
 * could only start every 256 units: 56% of the arena held). With exact = 0, m is rounded up
 * to a power of two (the classic buddy) and a block starts at a multiple of its size. Either
 * way a block is a run of buddy blocks and the free blocks are the unique maximal buddy
 * decomposition of the free units. stats' largest_free is the largest free buddy block; an
 * exact run may be larger when it spans a free block and the free units after it. Alloc, free
 * and grow are O(log^2 n) elementary steps at worst (log n <= 32); view and compact scan the
 * side table backwards (O(units of the block), O(units)); no malloc after init:
 * metadata is a side table of 10 bytes per min_block unit allocated at init, free lists are
 * intrusive doubly linked lists through that table (arena memory itself is never touched by
 * the allocator, so a free block costs no RSS).
 *
 * Grow. cb_arena_grow extends a block in place when the units after it are free and its
 * offset is aligned as the new size requires; otherwise it allocates a new block (first with
 * the old block still held, then, if that fails, by temporarily returning the old block so the
 * new one may overlap it) and moves the old block's requested bytes (memmove). If no block fits, it
 * fails with CB_STATUS_OUT_OF_MEMORY and the old block, its contents and the free lists are
 * exactly as before. Growing to a smaller size keeps the offset and returns the units no
 * longer needed (the first n bytes are kept).
 *
 * Threads. Every call on an arena takes its mutex; calls may come from any thread.
 * cb_arena_base() and the pointer arithmetic on it need no lock, but a block's bytes belong to
 * whoever holds its offset: a block that is freed or moved by grow must not be used through
 * the old offset.
 */
#ifndef COLIBRI_ARENA_H
#define COLIBRI_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cb_arena cb_arena_t;

typedef enum cb_arena_hugepages {
    CB_HUGEPAGES_AUTO = 0, /* hugetlb if enough are free, else THP, else plain; note why */
    CB_HUGEPAGES_OFF = 1,  /* plain pages, no madvise */
    CB_HUGEPAGES_ON = 2,   /* hugetlb 2 MiB pages or fail with CB_STATUS_UNSUPPORTED */
} cb_arena_hugepages;

typedef enum cb_arena_backing {
    CB_BACKING_ANON = 0, /* anonymous private mapping */
    CB_BACKING_SHM = 1,  /* an unlinked file in /dev/shm, MAP_SHARED */
} cb_arena_backing;

typedef struct cb_arena_params {
    size_t capacity;              /* bytes asked for (> 0); rounded up to a min_block multiple */
    size_t min_block;             /* bytes, power of two >= 64; default 4096 */
    cb_arena_hugepages hugepages; /* default CB_HUGEPAGES_AUTO */
    cb_arena_backing backing;     /* default CB_BACKING_ANON */
    int lock;                     /* non-zero: mlock the region (fail clearly if over RLIMIT_MEMLOCK) */
    int exact;                    /* non-zero (default): return the unused tail of each buddy block */
} cb_arena_params;

typedef struct cb_arena_stats {
    size_t capacity;      /* bytes managed (after rounding) */
    size_t used;          /* bytes in live blocks (whole units) */
    size_t free;          /* capacity - used */
    size_t largest_free;  /* bytes of the largest free buddy block */
    size_t n_blocks;      /* live blocks */
    size_t n_free_blocks; /* free buddy blocks */
    size_t requested;     /* sum of the sizes asked for by the live blocks */
    size_t internal_waste; /* used - requested */
    double external_fragmentation; /* 1 - largest_free / free; 0 when free == 0 */
    size_t min_block;
    size_t n_roots;       /* top-level buddy blocks covering the capacity */
    size_t mapped;        /* bytes mapped (>= capacity: hugetlb rounds to 2 MiB) */
    int exact;
    int locked;           /* mlock succeeded */
    const char *backing;      /* "hugetlb", "thp", "pages", "shm" or "shm+thp"; static */
    const char *backing_note; /* why a fallback happened, "" when none; valid while the arena lives */
} cb_arena_stats_t;

/* Defaults: capacity 0 (must be set), min_block 4096, AUTO, ANON, lock 0, exact 1. */
cb_arena_params cb_arena_default_params(void);

/* Maps and initialises an arena. *out is owned by the caller (cb_arena_free). Errors:
 * INVALID_ARGUMENT (bad capacity/min_block), UNSUPPORTED (hugepages ON not possible),
 * OUT_OF_MEMORY (mmap, metadata or mlock failed), IO (/dev/shm file). */
cb_status cb_arena_new(const cb_arena_params *params, cb_arena_t **out);

/* Releases the region now, unless pinned (then at the last cb_arena_unpin). The handle stays
 * valid: every later call returns CB_STATUS_CLOSED. Idempotent. */
void cb_arena_close(cb_arena_t *a);

/* Closes (ignoring pins: the caller guarantees no pointer into the region is used any more)
 * and frees the handle. NULL is accepted. */
void cb_arena_free(cb_arena_t *a);

/* Allocates a block of at least n bytes (n > 0). *offset: byte offset from the base.
 * INVALID_ARGUMENT for n == 0; OUT_OF_MEMORY (naming n and the largest free block) when no
 * free block fits. */
cb_status cb_arena_alloc(cb_arena_t *a, size_t n, size_t *offset);

/* Frees the live block starting at offset. INVALID_ARGUMENT when offset is not the start of a
 * live block (double free, interior offset, out of range). */
cb_status cb_arena_free_block(cb_arena_t *a, size_t offset);

/* Grows (or re-sizes) the live block at offset to hold n bytes; *new_offset is where it is now
 * (== offset when in place). The first min(n, old requested) bytes are preserved. */
cb_status cb_arena_grow(cb_arena_t *a, size_t offset, size_t n, size_t *new_offset);

/* Size asked for (*requested, bytes) and block size (*block, whole units, bytes) of the live
 * block at offset. Either pointer may be NULL. */
cb_status cb_arena_block_info(cb_arena_t *a, size_t offset, size_t *requested, size_t *block);

/* Checks that [offset, offset+n) lies inside the requested bytes of one live block and, if so,
 * pins the region (it stays mapped after cb_arena_close until the matching cb_arena_unpin) and
 * returns its address in *ptr (borrowed). n may be 0. */
cb_status cb_arena_view(cb_arena_t *a, size_t offset, size_t n, void **ptr);

/* Drops one pin taken by cb_arena_view; unmaps if the arena is closed and this was the last. */
void cb_arena_unpin(cb_arena_t *a);

/* Fills *s (see cb_arena_stats_t). CB_STATUS_CLOSED once closed. */
cb_status cb_arena_stats(cb_arena_t *a, cb_arena_stats_t *s);

/* Verifies every invariant: blocks inside the region, aligned (see above), no overlap,
 * every unit covered exactly once, free lists consistent (doubly linked, right order, counts),
 * coalescing complete (no free block whose buddy is a free block of the same order), counters
 * equal to a recount, used + free == capacity. CB_STATUS_INTERNAL naming the first broken one. */
cb_status cb_arena_check(cb_arena_t *a);

/* Slides the live blocks at offsets[0..n) (strictly increasing) down (up = 0: first to last,
 * each to the lowest start, aligned by the rule above, in the free stretch just before it) or
 * up (up != 0: last to first, each to the highest start in the free stretch just after it),
 * moving its requested bytes (memmove); offsets[i] receives each block's new offset. Blocks
 * not listed stay where they are. The caller owns the listed blocks and holds no pointer into
 * them across the call. INVALID_ARGUMENT (nothing moved) when an offset is not a live block or
 * they are not increasing. O(units) for the scans of the side table plus the bytes moved. */
cb_status cb_arena_compact(cb_arena_t *a, size_t *offsets, size_t n, int up);

/* Base address of the region (borrowed; NULL once closed, even while views pin it). */
uint8_t *cb_arena_base(const cb_arena_t *a);

/* ------------------------------------------------------------------------------------------
 * KV cache: sequences of tokens whose K and V live in one arena block per sequence.
 *
 * Layout (paged; inside a page, one K/V head's rows are one run):
 *   token_stride = n_layers * 2 * n_kv_heads * head_dim * elt_size   (bytes per token)
 *   a row is head_dim values of one token for one group g = (layer * 2 + kv) * n_kv_heads + head
 *     (kv: 0 = K, 1 = V);
 *   page p of a sequence (tokens [p*P, p*P + r), P = page_tokens, r = min(P, cap - p*P)) starts
 *   at block_offset + p*P * token_stride; inside it group g's r rows are contiguous:
 *   row (t, g) is at page + (g * r + t % P) * head_dim * elt_size (cb_kvcache_row_elem).
 * Every page but a block's last is full (r = P), so a block holds exactly cap tokens; when the
 * capacity changes (a reserve, the give-back below) only that last page is re-laid out (fewer
 * than P tokens move). Why: attention reads one head's rows of every token, and runs of a few
 * hundred bytes a token stride apart stream at a third of the bandwidth of long runs
 * (docs/benchmarks.md). page_tokens = 1 is the position-major layout (a token's rows together:
 * [layer][kv][kv_head][head_dim]), never re-laid out.
 *
 * Sequence ids are small integers (slots of a table of max_sequences preallocated at
 * cb_kvcache_new); a freed id may be reused. A sequence's capacity (tokens that fit without a
 * reserve, and the cap of the layout) is the token count it last reserved: the block's requested
 * bytes / token_stride. cb_kvcache_seq_reserve grows the block
 * through cb_arena_grow, rounding the token count up to a multiple of chunk_tokens, or, with
 * doubling, to at least twice the current capacity. When that does not fit, the cache is
 * full, not the request: it tries the exact token count; then (when the free bytes plus the
 * other sequences' rounding could hold it) gives back every sequence's rounding beyond the
 * most tokens it asked for, slides the blocks below this sequence's down and the ones above
 * it up (cb_arena_compact), so all the free room is right after this block, and tries again.
 * A cache sized for N tokens so holds >= 95% of N in any mix of lengths
 * (tests/core/test_kv_capacity.py). When nothing fits it fails with OUT_OF_MEMORY saying how full
 * the cache is (tokens held and reserved, live sequences, arena bytes in use of the total);
 * the sequence's length and tokens are unchanged (its block may have moved with the
 * compaction).
 *
 * Threads: table operations take the cache's mutex. Pointers from cb_kvcache_row_ptr and
 * cb_kvcache_seq_block are
 * valid until the next reserve of ANY sequence of the cache (a full reserve compacts, moving
 * other sequences' blocks) or free of that sequence; no sequence may be reserved while another
 * thread reads the cache through such a pointer (cb_forward_run reserves all its sequences
 * before it takes pointers).
 * ------------------------------------------------------------------------------------------ */

typedef struct cb_kvcache cb_kvcache_t;

typedef enum cb_kv_dtype {
    CB_KV_F32 = 0, /* 4-byte IEEE float */
    CB_KV_F16 = 1, /* 2-byte IEEE half */
} cb_kv_dtype;

typedef struct cb_kvcache_params {
    uint32_t n_layers;      /* > 0 */
    uint32_t n_kv_heads;    /* > 0 */
    uint32_t head_dim;      /* > 0 */
    cb_kv_dtype dtype;      /* default CB_KV_F16 */
    uint32_t max_sequences; /* table size, default 1024 */
    uint32_t chunk_tokens;  /* reserve granularity in tokens, default 16 */
    int doubling;           /* non-zero: a reserve at least doubles the capacity; default 0 */
    uint32_t page_tokens;   /* tokens per page (the layout above), default CB_KV_PAGE_TOKENS */
    size_t state_bytes;     /* fixed per-sequence recurrent state (cb_kvcache_seq_state), 0: none */
} cb_kvcache_params;

#define CB_KV_PAGE_TOKENS 256

/* Element offset, from the start of a block of capacity cap tokens, of element elem (counted in
 * a position-major token: elem = ((layer * 2 + kv) * n_kv_heads + head) * head_dim + i) of token
 * pos, for pages of page_tokens tokens, token_elems values a token and rows of row_elems
 * (head_dim) values. The one formula of the layout; pos < cap. */
static inline size_t cb_kvcache_row_elem(size_t pos, size_t cap, size_t page_tokens,
                                         size_t token_elems, size_t row_elems, size_t elem) {
    const size_t start = pos - pos % page_tokens;
    const size_t r = cap - start < page_tokens ? cap - start : page_tokens;
    return start * token_elems + (elem / row_elems * r + pos % page_tokens) * row_elems +
           elem % row_elems;
}

cb_kvcache_params cb_kvcache_default_params(void);

/* Creates a cache over arena (borrowed: it must outlive the cache). *out owned by the caller
 * (cb_kvcache_free). INVALID_ARGUMENT for zero dims, an unknown dtype or a token stride that
 * overflows; OUT_OF_MEMORY for the table. */
cb_status cb_kvcache_new(cb_arena_t *arena, const cb_kvcache_params *params, cb_kvcache_t **out);

/* Frees every live sequence's block (when the arena is still open); the handle stays valid and
 * every later call returns CB_STATUS_CLOSED. Idempotent; safe while other threads call in. */
void cb_kvcache_close(cb_kvcache_t *kv);

/* Closes and frees the cache. NULL ok. No other thread may be using it. */
void cb_kvcache_free(cb_kvcache_t *kv);

/* A new empty sequence (length 0, capacity 0, no block yet). OUT_OF_MEMORY when all
 * max_sequences ids are live. */
cb_status cb_kvcache_seq_new(cb_kvcache_t *kv, uint32_t *seq);

/* Makes room for n_tokens tokens (length unchanged). */
cb_status cb_kvcache_seq_reserve(cb_kvcache_t *kv, uint32_t seq, size_t n_tokens);

/* Copies the K and V of tokens [0, n_tokens) of sequence src (every layer; one memcpy for the
 * full pages, a run per row group for the last) into sequence dst, reserving dst for n_tokens first (which may
 * compact, like any reserve), and sets dst's length to n_tokens (whatever dst held beyond is
 * dropped). src is unchanged. INVALID_ARGUMENT when either is not live, src == dst or
 * n_tokens > src's length; OUT_OF_MEMORY (dst unchanged) when dst cannot hold n_tokens. */
cb_status cb_kvcache_copy_prefix(cb_kvcache_t *kv, uint32_t src, uint32_t dst, size_t n_tokens);

/* Frees the sequence's block and its id. INVALID_ARGUMENT for an id that is not live. */
cb_status cb_kvcache_seq_free(cb_kvcache_t *kv, uint32_t seq);

/* Length (tokens written) and capacity (tokens that fit) of a live sequence. */
cb_status cb_kvcache_seq_len(cb_kvcache_t *kv, uint32_t seq, size_t *len);
cb_status cb_kvcache_seq_capacity(cb_kvcache_t *kv, uint32_t seq, size_t *cap);

/* Sets the length; INVALID_ARGUMENT when n > capacity. */
cb_status cb_kvcache_seq_set_len(cb_kvcache_t *kv, uint32_t seq, size_t n);

/* Byte offset of the sequence's block in the arena (0 and *has_block = 0 before any reserve). */
cb_status cb_kvcache_seq_offset(cb_kvcache_t *kv, uint32_t seq, size_t *offset, int *has_block);

/* Recurrent state (params.state_bytes > 0: linear-attention layers, qwen3next). Every live
 * sequence owns state_bytes bytes beside its K/V block, zeroed by cb_kvcache_seq_new; it is the
 * state after the sequence's len tokens, so it follows the length only where that is exact: a
 * length set to 0 zeroes it, a length set below len fails with UNSUPPORTED (no truncation), a
 * copy_prefix copies it only for n_tokens == src's length (0: zeroed), else UNSUPPORTED; a
 * prefix is resumed from a snapshot (get / set). *state is borrowed until the sequence is freed
 * (64-byte aligned). get/set copy the whole state out of / into buf (state_bytes bytes). */
size_t cb_kvcache_state_bytes(const cb_kvcache_t *kv);
/* copy_prefix whose destination state is a copy of state (state_bytes bytes: a snapshot of
 * src's state after n_tokens tokens, taken by cb_kvcache_state_get then) for any n_tokens. */
cb_status cb_kvcache_copy_prefix_state(cb_kvcache_t *kv, uint32_t src, uint32_t dst,
                                       size_t n_tokens, const void *state);
cb_status cb_kvcache_seq_state(cb_kvcache_t *kv, uint32_t seq, void **state);
cb_status cb_kvcache_state_get(cb_kvcache_t *kv, uint32_t seq, void *buf);
cb_status cb_kvcache_state_set(cb_kvcache_t *kv, uint32_t seq, const void *buf);

/* Bytes per token (see the layout above). */
size_t cb_kvcache_token_stride(const cb_kvcache_t *kv);

/* Tokens per page (params.page_tokens) and values per row (head_dim); 0 for NULL. */
size_t cb_kvcache_page_tokens(const cb_kvcache_t *kv);
size_t cb_kvcache_row_elems(const cb_kvcache_t *kv);

/* Number of live sequences; ids[0..min(n, max_ids)) receives them in increasing order. */
size_t cb_kvcache_list(cb_kvcache_t *kv, uint32_t *ids, size_t max_ids);

/* Address of the row of K (kv_index 0) or V (1) of token pos, layer, kv_head: head_dim elements
 * of dtype. Bounds-checked against capacity; INVALID_ARGUMENT otherwise. *ptr is borrowed (see
 * the thread note above). */
cb_status cb_kvcache_row_ptr(cb_kvcache_t *kv, uint32_t seq, size_t pos, uint32_t layer,
                             uint32_t kv_index, uint32_t kv_head, void **ptr);

/* The sequence's block (*base; NULL before its first reserve) and capacity, in one call: with
 * cb_kvcache_row_elem they address every row (what cb_forward_run does). */
cb_status cb_kvcache_seq_block(cb_kvcache_t *kv, uint32_t seq, void **base, size_t *cap);

/* Copy K (kv_index 0) or V (1) of layer for tokens [start, start + n) between the cache and buf,
 * n * n_kv_heads * head_dim elements of dtype in C order [token][kv_head][head_dim]: read copies
 * out of the cache, write into it. start + n must be within the capacity (not the length: the
 * length is set after writing); INVALID_ARGUMENT otherwise, nothing copied. The block is pinned
 * while copying (cb_arena_view), so a concurrent cb_arena_close never unmaps it mid-copy. */
cb_status cb_kvcache_read(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                          size_t start, size_t n, void *buf);
cb_status cb_kvcache_write(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                           size_t start, size_t n, const void *buf);

#ifdef __cplusplus
}
#endif
#endif
