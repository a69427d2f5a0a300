/* The expert store: where the forward pass gets the weights of routed experts.
 *
 * The MoE layer never reads expert weights directly: it asks the store for the experts the
 * router chose (cb_experts_acquire) and gives them back when the layer is done
 * (cb_experts_release). Between the two calls the returned pointers stay valid and unchanged.
 * This lets the store decide where experts come from; the forward pass is the same for every
 * store.
 *
 * Store kinds (cb_experts_params_t.mode):
 *   CB_EXPERTS_MAPPED - the experts live in memory the caller owns (an mmap of the model
 *     file): acquire only computes addresses (base + expert * stride). Faults pages in on first
 *     touch, like llama.cpp's mmap. This is the full-RAM path and the reference that every
 *     other store must match bit for bit.
 *   CB_EXPERTS_CACHE - a fixed pool of slots allocated once (anonymous mmap, MADV_HUGEPAGE
 *     when huge_pages, mlock'ed when mlock); a slot holds one expert's gate, up and down. A
 *     miss is read from the model file with pread into a free slot or a victim's: ONE read per
 *     expert when its three ranges are adjacent in the file (the colibri container: gate|up|down
 *     per expert, strides equal; the slot then keeps the file's relative offsets, small gaps
 *     included), else three reads (GGUF: one per stacked tensor; each matrix 64-byte aligned in
 *     the slot). Lookups are O(1) (a table (layer, expert) -> slot); victim choice is O(1) for
 *     LRU (a list) and O(log n) for LFRU (a heap). Only unlocked, unpinned, fully loaded
 *     experts are candidates: an expert acquired and not yet released is never evicted.
 *   CB_EXPERTS_MMAP - the mapped store plus residency control: the store tracks a resident
 *     set of at most budget bytes with the same policies; a newly used expert gets
 *     madvise(WILLNEED) and is faulted in by the compute; an evicted one gets madvise(DONTNEED)
 *     on the whole pages inside its ranges and posix_fadvise(DONTNEED) on its file ranges, so
 *     the process's resident set (and the page cache) stay near the budget.
 *
 * Prefetch (cache and mmap, params.prefetch): the store owns a background thread. The forward
 * pass hints the experts it expects the next MoE layer to use (cb_experts_prefetch); the
 * thread reads them (cache: pread into a free slot or a victim's; mmap: madvise(WILLNEED))
 * while the compute runs. A new hint replaces the hints not yet started (they are stale: the
 * compute has moved on), so the compute never waits on a prefetch it no longer needs. An
 * acquire that wants an expert the thread is reading right now waits for that read (counted in
 * wait_ns) instead of reading it twice. A prefetched expert is an ordinary resident (evictable
 * under the policy); the thread never evicts locked or pinned experts nor an expert hinted by
 * the current hint, and evicts nothing while fewer than half of its recent reads were used
 * before eviction (then it fills free slots only). The pread runs outside the store's mutex.
 * Tokens never depend on prefetch.
 *
 * Policies: CB_EXPERTS_LRU evicts the least recently released expert. CB_EXPERTS_LFRU is
 * frequency-aware with dynamic aging (LFU-DA): an expert's key is A + f, where f counts its
 * acquisitions since the store was made (kept across evictions) and A is the key of the last
 * victim (the "age"); the smallest key goes first, ties by least recent use.
 *
 * Pool size rule (cache and mmap): slots = budget_bytes / slot_bytes, raised to min_slots
 * (the caller passes the most experts one acquire can ask for: over the MoE layers, the max of
 * min(n_expert, n_expert_used * max_batch)) and capped at the total number of experts. An
 * acquire asking for more experts than the unpinned slots fails with the numbers.
 *
 * Layout of one layer's experts: expert e's gate matrix [n_ff rows x n_embd cols] is gate_bytes
 * bytes at gate_base + e * gate_stride (file offset gate_off + e * gate_stride), likewise up
 * ([n_ff x n_embd]) and down ([n_embd x n_ff]). GGUF ffn_{gate,up,down}_exps: three 3-D
 * tensors, bytes == stride. Container: one block per expert, strides == the block size.
 * Types are GGML type ids (quant.h).
 *
 * Ownership: the store borrows every base pointer (the caller keeps the mapping alive for the
 * store's lifetime) and owns its tables, pool, prefetch thread and file descriptor (cache and
 * mmap modes open params.path read-only; every range is checked against the file's size). The
 * cache store's pool can be page-locked by an outside owner (cb_experts_pin_pool: a GPU
 * runtime's cuMemHostRegister) while the store keeps owning it: the store unpins before it
 * unmaps.
 * Statistics count, per layer, acquisitions (expert uses), distinct experts per call, and
 * bytes touched.
 *
 * Threads: acquire/release/pin/prefetch of one store are called by one thread at a time (the
 * forward pass); the store's own prefetch thread synchronises with them through a mutex.
 * stats/info/reset_stats may be called from any thread.
 */
#ifndef COLIBRI_EXPERTS_H
#define COLIBRI_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cb_experts cb_experts_t;

/* One layer's expert tensors (all borrowed). */
typedef struct cb_experts_layer {
    int32_t n_expert;          /* experts in this layer (0: a dense layer, no experts) */
    int32_t type_gate, type_up, type_down; /* GGML type ids */
    int64_t n_embd, n_ff;      /* gate/up: [n_ff x n_embd]; down: [n_embd x n_ff] */
    const uint8_t *gate_base, *up_base, *down_base;
    size_t gate_stride, up_stride, down_stride; /* bytes from one expert to the next */
    uint64_t gate_off, up_off, down_off; /* file offsets of expert 0 (cache and mmap modes) */
    size_t gate_bytes, up_bytes, down_bytes; /* bytes of one matrix (0: its stride) */
} cb_experts_layer_t;

typedef enum cb_experts_mode {
    CB_EXPERTS_MAPPED = 0,
    CB_EXPERTS_CACHE = 1,
    CB_EXPERTS_MMAP = 2,
} cb_experts_mode;

typedef enum cb_experts_policy {
    CB_EXPERTS_LRU = 0,
    CB_EXPERTS_LFRU = 1,
} cb_experts_policy;

typedef struct cb_experts_params {
    int32_t mode;         /* cb_experts_mode */
    int32_t policy;       /* cb_experts_policy */
    const char *path;     /* cache/mmap: the model file (borrowed during new) */
    uint64_t budget_bytes;/* cache/mmap: bytes of experts kept resident */
    int32_t min_slots;    /* cache/mmap: the pool holds at least this many experts */
    int32_t huge_pages;   /* cache: madvise(MADV_HUGEPAGE) the pool (default 1) */
    int32_t mlock;        /* cache: mlock the pool (fails with the numbers when refused) */
    int32_t prefetch;     /* cache/mmap: run the prefetch thread (default 0) */
    int32_t direct_io;    /* cache: read with O_DIRECT where the file system allows it, so
                             misses bypass the page cache (no second copy of the bytes read,
                             which a memory limit counts) and read faster at queue depth 1-4:
                             0 never; 1 (default) when the alignment's slack (up to 8 KiB per
                             matrix) costs at most 1/16 of a slot, i.e. experts of ~400 KiB and
                             up; 2 whenever the file system allows it */
} cb_experts_params_t;

/* What a store is: its mode, slots and their size. */
typedef struct cb_experts_info {
    int32_t mode, policy;
    int32_t n_slots;      /* experts the store keeps resident at most (0: mapped) */
    int32_t n_pinned;
    int32_t prefetch;     /* 1 when the prefetch thread runs */
    int32_t one_read_layers; /* MoE layers whose experts are read with one pread each */
    int32_t direct_io;    /* 1 when the cache store reads with O_DIRECT */
    uint64_t slot_bytes;  /* bytes of one slot (cache) or of the largest expert (mmap) */
    uint64_t pool_bytes;  /* bytes of the slot pool (cache; 0 otherwise) */
    uint64_t expert_bytes;/* bytes of every expert of every layer */
} cb_experts_info_t;

/* What acquire returns for one expert: borrowed pointers to its three matrices. */
typedef struct cb_expert_ref {
    const uint8_t *gate, *up, *down;
} cb_expert_ref_t;

typedef struct cb_experts_layer_stats {
    uint64_t uses;        /* (token, expert) routings served */
    uint64_t acquired;    /* experts handed out (once per expert per batch) */
    uint64_t hits;        /* acquired experts that were already resident */
    uint64_t misses;      /* acquired experts that had to be read */
    uint64_t bytes_read;  /* bytes read from the file for misses */
    uint64_t wait_ns;     /* time the forward pass waited inside acquire */
    uint64_t evictions;   /* experts dropped to make room */
    uint64_t resident;    /* experts resident now (cache/mmap; 0 for mapped) */
    uint64_t resident_bytes; /* their bytes */
    uint64_t reads;       /* pread calls issued for misses and prefetches (cache mode) */
    uint64_t prefetch_issued; /* experts the prefetch thread read (cache) or advised (mmap) */
    uint64_t prefetch_hits;   /* acquired experts resident because of a prefetch */
    uint64_t prefetch_wasted; /* prefetched experts evicted before any acquire used them */
    /* the next-layer prediction (cb_experts_prefetch hints), scored at the layer's next
     * acquire: precision = predicted_used / predicted, recall = predicted_used /
     * predicted_acquired (counted whether or not the prefetch thread read them) */
    uint64_t predicted;          /* experts hinted for this layer */
    uint64_t predicted_used;     /* of those, acquired by the acquire that followed the hint */
    uint64_t predicted_acquired; /* experts acquired by acquires that followed a hint */
} cb_experts_layer_stats_t;

cb_experts_params_t cb_experts_default_params(void);

/* A store over n_layers layers (layers[] copied; the bases stay borrowed). */
cb_status cb_experts_new(const cb_experts_params_t *params, const cb_experts_layer_t *layers,
                         int32_t n_layers, cb_experts_t **out);

cb_status cb_experts_info(const cb_experts_t *s, cb_experts_info_t *out);

/* Makes expert (layer, expert) resident (reading it if needed) and never evicts it.
 * INVALID_ARGUMENT for the mapped store, a bad id, or when pinning would leave fewer than
 * min_slots unpinned slots. Pinning a pinned expert does nothing. */
cb_status cb_experts_pin(cb_experts_t *s, int32_t layer, int32_t expert);

/* Frees the store (not the memory its bases point into); unpins a pinned pool first. NULL
 * accepted. */
void cb_experts_free(cb_experts_t *s);

/* Pointers for experts ids[0..n) of layer; out[i] receives expert ids[i]. uses[i] (nullable)
 * is how many tokens each expert serves in this batch (statistics only). INVALID_ARGUMENT for
 * a bad layer or expert id. */
cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                             const int32_t *uses, cb_expert_ref_t *out);

/* The same acquire in three steps, so that compute overlaps the misses' reads:
 * cb_experts_acquire_start claims the slots and starts the reads (cache store: on reader
 * threads) and fills out[] at once; out[i]'s bytes may be used only after
 * cb_experts_wait(s, i) returned CB_OK (in any order; waiting for expert i does not wait for
 * the others); cb_experts_acquire_finish must follow every successful start (after the last
 * wait or instead of it): it waits for every read still running and does the bookkeeping. On
 * CB_OK from finish the experts are acquired (cb_experts_release gives them back); on an error
 * (a read failed: the detail names the file, layer, expert and range, and wait returned it
 * for that expert) nothing stays acquired, as after a failed cb_experts_acquire. One started
 * acquire per store at a time (INVALID_ARGUMENT otherwise). Mapped and mmap stores read
 * nothing asynchronously: their waits return at once. */
cb_status cb_experts_acquire_start(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                                   const int32_t *uses, cb_expert_ref_t *out);
cb_status cb_experts_wait(cb_experts_t *s, int32_t i);
cb_status cb_experts_acquire_finish(cb_experts_t *s);

/* Gives back what acquire handed out for the same layer and ids. */
cb_status cb_experts_release(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n);

/* Hints that the next acquire(s) of layer will ask for experts ids[0..n) (duplicates and
 * resident ones are fine). Returns at once: the prefetch thread reads them in the background.
 * Replaces the hints not yet started. Does nothing for the mapped store or without prefetch.
 * INVALID_ARGUMENT for a bad layer or expert id. */
cb_status cb_experts_prefetch(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n);

/* The number of reads the started acquire in progress runs (0: none, all its experts were
 * resident, or no started acquire). NULL: 0. */
int32_t cb_experts_reads_pending(const cb_experts_t *s);

/* 1 when the store runs a prefetch thread (hints are worth computing), else 0. NULL: 0. */
int32_t cb_experts_prefetching(const cb_experts_t *s);

/* Waits until the prefetch thread has nothing queued or in flight (tests, benchmarks). */
void cb_experts_prefetch_sync(cb_experts_t *s);

/* The cache store's slot pool: the single allocation made at creation (page-aligned, bytes a
 * multiple of 2 MiB), owned by the store; slot k is [base + k * slot_bytes, + slot_bytes).
 * Acquire's pointers in cache mode lie inside it. pinned: 1 while a pin callback holds it. */
typedef struct cb_experts_pool {
    uint8_t *base;        /* borrowed: valid until cb_experts_free */
    size_t bytes;         /* the whole mapping (>= n_slots * slot_bytes) */
    size_t slot_bytes;
    int32_t n_slots;
    int32_t pinned;
} cb_experts_pool_t;

/* Page-locks (or otherwise registers) the pool: called once with the whole range. A failure is
 * returned by cb_experts_pin_pool (set its detail with cb_fail). */
typedef cb_status (*cb_experts_pool_pin_fn)(void *user, uint8_t *base, size_t bytes);
/* Undoes pin for the same range; must not fail (it runs inside cb_experts_free). */
typedef void (*cb_experts_pool_unpin_fn)(void *user, uint8_t *base, size_t bytes);

/* The slot pool of a cache store. INVALID_ARGUMENT for the mapped and mmap stores (no pool). */
cb_status cb_experts_pool(const cb_experts_t *s, cb_experts_pool_t *out);

/* Registers the pool with an external owner of page locks (colibri.cuda: cuMemHostRegister
 * through PyCUDA): calls pin(user, base, bytes) now, and the store calls unpin(user, base,
 * bytes) exactly once - from cb_experts_unpin_pool, or from cb_experts_free BEFORE the pool is
 * unmapped - so a freed store never leaves a registered range behind. user is borrowed until
 * then. One registration at a time: INVALID_ARGUMENT when already pinned, for a store without
 * a pool, or NULL callbacks; pin's own status when it fails (nothing is kept then). Called by
 * the thread that owns the store (not concurrently with acquire). */
cb_status cb_experts_pin_pool(cb_experts_t *s, cb_experts_pool_pin_fn pin,
                              cb_experts_pool_unpin_fn unpin, void *user);

/* Calls unpin for the current registration and forgets it; does nothing when not pinned or
 * s is NULL. */
void cb_experts_unpin_pool(cb_experts_t *s);

/* TEST ONLY (I/O fault injection): a replacement for pread(2) that the cache store calls for
 * every read of the model file: read up to len bytes at file offset off into buf and return the
 * bytes read (0 at the end of the file) or -1 with errno set. Called concurrently from the
 * acquire's reader threads and the prefetch thread. The store retries EINTR, continues after a
 * short read and fails any other error (or the end of the file) with CB_STATUS_IO naming the
 * file, layer and expert; a slot whose read failed is never handed out. */
typedef int64_t (*cb_experts_read_fn)(void *user, int fd, void *buf, size_t len, uint64_t off);

/* TEST ONLY: installs fn (NULL: plain pread again) after any prefetch read in flight ends. Called
 * by the thread that owns the store, not concurrently with acquire. No-op for the mapped store. */
void cb_experts_set_read_hook(cb_experts_t *s, cb_experts_read_fn fn, void *user);

/* Statistics of one layer (layer >= 0) or the sum of all (layer == -1). */
cb_status cb_experts_stats(const cb_experts_t *s, int32_t layer, cb_experts_layer_stats_t *out);

/* Per-expert routing counts of a layer: counts[0..n_expert) (how often each was chosen). */
cb_status cb_experts_route_counts(const cb_experts_t *s, int32_t layer, uint64_t *counts,
                                  int32_t n_expert);

/* Zeroes every statistic and count. */
void cb_experts_reset_stats(cb_experts_t *s);

#ifdef __cplusplus
}
#endif
#endif
