from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t

from colibri._core.status cimport cb_status
from colibri._core.quant cimport cb_matrix_t
from colibri._core.threadpool cimport cb_threadpool_t
from colibri._core.arena cimport cb_kvcache_t


cdef extern from "colibri/experts.h" nogil:
    ctypedef struct cb_experts_t:
        pass
    ctypedef struct cb_experts_layer_t:
        int32_t n_expert
        int32_t type_gate, type_up, type_down
        int64_t n_embd, n_ff
        const uint8_t *gate_base
        const uint8_t *up_base
        const uint8_t *down_base
        size_t gate_stride, up_stride, down_stride
        uint64_t gate_off, up_off, down_off
        size_t gate_bytes, up_bytes, down_bytes
    ctypedef struct cb_experts_layer_stats_t:
        uint64_t uses, acquired, hits, misses, bytes_read, wait_ns
        uint64_t evictions, resident, resident_bytes
        uint64_t reads, prefetch_issued, prefetch_hits, prefetch_wasted
        uint64_t predicted, predicted_used, predicted_acquired
    ctypedef struct cb_experts_params_t:
        int32_t mode, policy
        const char *path
        uint64_t budget_bytes
        int32_t min_slots, huge_pages, mlock, prefetch, direct_io
    ctypedef struct cb_experts_info_t:
        int32_t mode, policy, n_slots, n_pinned, prefetch, one_read_layers, direct_io
        uint64_t slot_bytes, pool_bytes, expert_bytes
    ctypedef struct cb_experts_pool_t:
        uint8_t *base
        size_t bytes, slot_bytes
        int32_t n_slots, pinned
    ctypedef struct cb_expert_ref_t:
        const uint8_t *gate
        const uint8_t *up
        const uint8_t *down
    ctypedef cb_status (*cb_experts_pool_pin_fn)(void *user, uint8_t *base, size_t bytes) noexcept
    ctypedef void (*cb_experts_pool_unpin_fn)(void *user, uint8_t *base, size_t bytes) noexcept
    cb_status cb_experts_pool(const cb_experts_t *s, cb_experts_pool_t *out)
    cb_status cb_experts_pin_pool(cb_experts_t *s, cb_experts_pool_pin_fn pin,
                                  cb_experts_pool_unpin_fn unpin, void *user)
    void cb_experts_unpin_pool(cb_experts_t *s)
    cb_status cb_experts_acquire(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n,
                                 const int32_t *uses, cb_expert_ref_t *out)
    cb_status cb_experts_release(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n)
    cb_experts_params_t cb_experts_default_params()
    cb_status cb_experts_new(const cb_experts_params_t *params, const cb_experts_layer_t *layers,
                             int32_t n_layers, cb_experts_t **out)
    cb_status cb_experts_info(const cb_experts_t *s, cb_experts_info_t *out)
    cb_status cb_experts_pin(cb_experts_t *s, int32_t layer, int32_t expert)
    void cb_experts_free(cb_experts_t *s)
    cb_status cb_experts_stats(const cb_experts_t *s, int32_t layer, cb_experts_layer_stats_t *out)
    cb_status cb_experts_route_counts(const cb_experts_t *s, int32_t layer, uint64_t *counts,
                                      int32_t n_expert)
    void cb_experts_reset_stats(cb_experts_t *s)
    cb_status cb_experts_prefetch(cb_experts_t *s, int32_t layer, const int32_t *ids, int32_t n)
    int32_t cb_experts_prefetching(const cb_experts_t *s)
    void cb_experts_prefetch_sync(cb_experts_t *s)
    # test only (I/O fault injection): a pread replacement for the cache store's reads
    ctypedef int64_t (*cb_experts_read_fn)(void *user, int fd, void *buf, size_t len,
                                           uint64_t off) noexcept nogil
    void cb_experts_set_read_hook(cb_experts_t *s, cb_experts_read_fn fn, void *user)


cdef extern from "colibri/forward.h" nogil:
    # The structs' fields are written once, in forward.h's field tables; Python fills them by
    # name through cb_desc_fields (_desc.pxi), so only what Forward joins is named here.
    ctypedef struct cb_layer_desc_t:
        pass
    ctypedef struct cb_model_desc_t:
        int32_t n_layer
        const cb_layer_desc_t *layers
    enum cb_desc_kind:
        CB_DESC_I32
        CB_DESC_I64
        CB_DESC_F32
        CB_DESC_ENUM
        CB_DESC_VEC
        CB_DESC_MAT
    ctypedef struct cb_desc_field_t:
        const char *name
        size_t offset
        int32_t kind
    int32_t cb_desc_fields(int layer, const cb_desc_field_t **out)

    ctypedef struct cb_forward_t:
        pass

    ctypedef struct cb_batch_t:
        int32_t n_tokens
        const int32_t *tokens
        const float *embd
        const uint32_t *seq
        const int32_t *pos
        const int8_t *logits

    cb_status cb_forward_new(const cb_model_desc_t *model, cb_kvcache_t *kv, cb_experts_t *experts,
                             cb_threadpool_t *pool, int32_t max_batch, cb_forward_t **out)
    void cb_forward_free(cb_forward_t *f)
    cb_status cb_forward_run(cb_forward_t *f, const cb_batch_t *batch, float *logits_out)
    ctypedef cb_status (*cb_moe_hook_fn)(void *user, int32_t layer, const float *h,
                                         const float *logits, int64_t n_tokens, float *out) noexcept
    void cb_forward_set_moe_hook(cb_forward_t *f, cb_moe_hook_fn fn, void *user)
    void cb_forward_set_deterministic(cb_forward_t *f, int deterministic)


cdef extern from "routing_logic.h" nogil:
    enum:
        CB_GATING_SOFTMAX
        CB_GATING_SIGMOID
        CB_GATING_SPARSEMIXER
        CB_GATING_SOFTMAX_WEIGHT
        CB_ROUTE_MAX_EXPERTS
        CB_ROUTE_MAX_K
        CB_ROUTE_WARP_MAX_EXPERTS
