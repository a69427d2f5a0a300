from libc.stdint cimport uint8_t, uint32_t

from colibri._core.status cimport cb_status


cdef extern from "colibri/arena.h" nogil:
    ctypedef struct cb_arena_t:
        pass

    ctypedef enum cb_arena_hugepages:
        CB_HUGEPAGES_AUTO
        CB_HUGEPAGES_OFF
        CB_HUGEPAGES_ON

    ctypedef enum cb_arena_backing:
        CB_BACKING_ANON
        CB_BACKING_SHM

    ctypedef struct cb_arena_params:
        size_t capacity
        size_t min_block
        cb_arena_hugepages hugepages
        cb_arena_backing backing
        int lock
        int exact

    ctypedef struct cb_arena_stats_t:
        size_t capacity
        size_t used
        size_t free
        size_t largest_free
        size_t n_blocks
        size_t n_free_blocks
        size_t requested
        size_t internal_waste
        double external_fragmentation
        size_t min_block
        size_t n_roots
        size_t mapped
        int exact
        int locked
        const char *backing
        const char *backing_note

    cb_arena_params cb_arena_default_params()
    cb_status cb_arena_new(const cb_arena_params *params, cb_arena_t **out)
    void cb_arena_close(cb_arena_t *a)
    void cb_arena_free(cb_arena_t *a)
    cb_status cb_arena_alloc(cb_arena_t *a, size_t n, size_t *offset)
    cb_status cb_arena_free_block(cb_arena_t *a, size_t offset)
    cb_status cb_arena_grow(cb_arena_t *a, size_t offset, size_t n, size_t *new_offset)
    cb_status cb_arena_block_info(cb_arena_t *a, size_t offset, size_t *requested, size_t *block)
    cb_status cb_arena_view(cb_arena_t *a, size_t offset, size_t n, void **ptr)
    void cb_arena_unpin(cb_arena_t *a)
    cb_status cb_arena_stats(cb_arena_t *a, cb_arena_stats_t *s)
    cb_status cb_arena_check(cb_arena_t *a)
    cb_status cb_arena_compact(cb_arena_t *a, size_t *offsets, size_t n, int up)
    uint8_t *cb_arena_base(const cb_arena_t *a)

    ctypedef struct cb_kvcache_t:
        pass

    ctypedef enum cb_kv_dtype:
        CB_KV_F32
        CB_KV_F16

    ctypedef struct cb_kvcache_params:
        uint32_t n_layers
        uint32_t n_kv_heads
        uint32_t head_dim
        cb_kv_dtype dtype
        uint32_t max_sequences
        uint32_t chunk_tokens
        int doubling
        uint32_t page_tokens
        size_t state_bytes

    cb_kvcache_params cb_kvcache_default_params()
    cb_status cb_kvcache_new(cb_arena_t *arena, const cb_kvcache_params *params, cb_kvcache_t **out)
    void cb_kvcache_close(cb_kvcache_t *kv)
    void cb_kvcache_free(cb_kvcache_t *kv)
    cb_status cb_kvcache_seq_new(cb_kvcache_t *kv, uint32_t *seq)
    cb_status cb_kvcache_seq_reserve(cb_kvcache_t *kv, uint32_t seq, size_t n_tokens)
    cb_status cb_kvcache_seq_free(cb_kvcache_t *kv, uint32_t seq)
    cb_status cb_kvcache_copy_prefix(cb_kvcache_t *kv, uint32_t src, uint32_t dst, size_t n_tokens)
    cb_status cb_kvcache_seq_len(cb_kvcache_t *kv, uint32_t seq, size_t *len)
    cb_status cb_kvcache_seq_capacity(cb_kvcache_t *kv, uint32_t seq, size_t *cap)
    cb_status cb_kvcache_seq_set_len(cb_kvcache_t *kv, uint32_t seq, size_t n)
    cb_status cb_kvcache_seq_offset(cb_kvcache_t *kv, uint32_t seq, size_t *offset, int *has_block)
    size_t cb_kvcache_token_stride(const cb_kvcache_t *kv)
    size_t cb_kvcache_list(cb_kvcache_t *kv, uint32_t *ids, size_t max_ids)
    size_t cb_kvcache_page_tokens(const cb_kvcache_t *kv)
    size_t cb_kvcache_state_bytes(const cb_kvcache_t *kv)
    cb_status cb_kvcache_seq_state(cb_kvcache_t *kv, uint32_t seq, void **state)
    cb_status cb_kvcache_state_get(cb_kvcache_t *kv, uint32_t seq, void *buf)
    cb_status cb_kvcache_state_set(cb_kvcache_t *kv, uint32_t seq, const void *buf)
    cb_status cb_kvcache_copy_prefix_state(cb_kvcache_t *kv, uint32_t src, uint32_t dst,
                                           size_t n_tokens, const void *state) nogil
    cb_status cb_kvcache_row_ptr(cb_kvcache_t *kv, uint32_t seq, size_t pos, uint32_t layer,
                                 uint32_t kv_index, uint32_t kv_head, void **ptr)
    cb_status cb_kvcache_read(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                              size_t start, size_t n, void *buf) nogil
    cb_status cb_kvcache_write(cb_kvcache_t *kv, uint32_t seq, uint32_t layer, uint32_t kv_index,
                               size_t start, size_t n, const void *buf) nogil
