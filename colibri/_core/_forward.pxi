"""The C forward pass over a model description (colibri.arch.ModelDesc, a CModelDesc of
_desc.pxi)."""

cimport cython

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset

import operator
import os

import numpy as np

from colibri.errors import OutOfRangeError

from colibri._core.quant cimport cb_matrix_t
from colibri._core.forward cimport (
    cb_experts_t, cb_experts_layer_t, cb_experts_layer_stats_t, cb_experts_params_t,
    cb_experts_info_t, cb_experts_default_params, cb_experts_new, cb_experts_info, cb_experts_pin,
    cb_experts_free, cb_experts_stats, cb_experts_route_counts, cb_experts_reset_stats,
    cb_experts_prefetch, cb_experts_prefetch_sync, cb_experts_pool_t, cb_expert_ref_t,
    cb_experts_pool, cb_experts_pin_pool, cb_experts_unpin_pool, cb_experts_acquire,
    cb_experts_release,
    cb_layer_desc_t, cb_model_desc_t, cb_forward_t, cb_batch_t, cb_forward_new, cb_forward_free,
    cb_forward_run, cb_forward_set_moe_hook, cb_forward_set_deterministic,
)
from colibri._core.forward cimport cb_experts_read_fn, cb_experts_set_read_hook  # test only
from colibri._core.forward cimport (
    CB_GATING_SIGMOID, CB_GATING_SOFTMAX, CB_GATING_SOFTMAX_WEIGHT, CB_GATING_SPARSEMIXER,
    CB_ROUTE_MAX_EXPERTS, CB_ROUTE_MAX_K, CB_ROUTE_WARP_MAX_EXPERTS,
)


def _int_array(values, str what, lo, hi, dtype):
    """values as a flat contiguous array of dtype, every one checked against [lo, hi) first
    (before any narrowing conversion could wrap it): ValueError naming the first bad one."""
    a = np.asarray(values)
    if a.size and not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
        raise TypeError(f"{what}s must be integers, got {a.dtype}")
    a = a.reshape(-1)
    if a.size and (a.min() < lo or a.max() >= hi):
        bad = int(a[(a < lo) | (a >= hi)][0])
        raise ValueError(f"{what} {bad} is out of range [{lo}, {hi})")
    return np.ascontiguousarray(a, dtype=dtype)


_EXPERT_MODES = {"mapped": CB_EXPERTS_MAPPED, "cache": CB_EXPERTS_CACHE, "mmap": CB_EXPERTS_MMAP}
_POLICIES = {"lru": CB_EXPERTS_LRU, "lfru": CB_EXPERTS_LFRU}
# routing (cuda/routing_logic.h, shared by the C forward pass and the CUDA kernels)
GATING_SOFTMAX = CB_GATING_SOFTMAX
GATING_SIGMOID = CB_GATING_SIGMOID
GATING_SPARSEMIXER = CB_GATING_SPARSEMIXER
GATING_SOFTMAX_WEIGHT = CB_GATING_SOFTMAX_WEIGHT
ROUTE_MAX_EXPERTS = CB_ROUTE_MAX_EXPERTS
ROUTE_MAX_K = CB_ROUTE_MAX_K
ROUTE_WARP_MAX_EXPERTS = CB_ROUTE_WARP_MAX_EXPERTS


cdef int32_t _index(object value, int32_t n, str what, bint all_ok=False) except? -2:
    """A caller's index checked against [0, n) (or -1 for "all" where all_ok): OutOfRangeError
    (an IndexError and a ValueError) naming it otherwise (TypeError for a non-integer)."""
    v = operator.index(value)
    if (all_ok and v == -1) or 0 <= v < n:
        return <int32_t>v
    raise OutOfRangeError(f"{what} {v} is out of range [0, {n})" + (" (or -1 for all)" if all_ok else ""))


cdef cb_status _pool_pin_cb(void *user, uint8_t *base, size_t n) noexcept with gil:
    """cb_experts_pool_pin_fn: ExpertStore's pin(view) on a numpy view of the pool (the view
    does not own the memory; the store unpins before freeing it)."""
    cdef ExpertStore st = <ExpertStore>user
    try:
        view = np.asarray(<uint8_t[:n]>base)
        st._pin_handle = st._pin_fn(view)
    except BaseException as exc:
        st._pin_error = exc
        return CB_STATUS_INTERNAL
    return CB_OK


cdef void _pool_unpin_cb(void *user, uint8_t *base, size_t n) noexcept with gil:
    """cb_experts_pool_unpin_fn: unpin(handle); never raises into C (an error is kept in
    ExpertStore.unpin_error)."""
    cdef ExpertStore st = <ExpertStore>user
    handle, fn = st._pin_handle, st._unpin_fn
    st._pin_handle = st._pin_fn = st._unpin_fn = None
    try:
        if fn is not None:
            fn(handle)
    except BaseException as exc:
        st.unpin_error = exc


class _PoolBuffer:
    """The array interface of the store's slot pool, holding the store alive."""

    def __init__(self, store, uintptr_t addr, size_t nbytes):
        self.store = store
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (addr, False), "version": 3}


# ---- test only: I/O fault injection under the cache store (ExpertStore._test_set_read_fault) ----

from libc.errno cimport EIO, EINTR
from posix.types cimport off_t
from posix.unistd cimport pread

cdef extern from *:
    """
    #include <errno.h>
    static long cb_test_fault_count(long *p) { return __atomic_fetch_add(p, 1, __ATOMIC_RELAXED); }
    static int64_t cb_test_fail_errno(int e) { errno = e; return -1; }
    """
    long cb_test_fault_count(long *p) noexcept nogil
    int64_t cb_test_fail_errno(int e) noexcept nogil

_FAULT_KINDS = {"eio": 1, "eof": 2, "eintr": 3, "short": 4}

ctypedef struct _fault_plan:
    int kind
    uint64_t lo[3]
    uint64_t hi[3]
    long faults


cdef class _ReadFault:
    """TEST ONLY: one fault plan; the store's read hook points at its plan."""
    cdef _fault_plan plan


cdef int64_t _fault_read(void *user, int fd, void *buf, size_t n, uint64_t off) noexcept nogil:
    """cb_experts_read_fn: pread, unless the range touches the planned expert's matrices."""
    cdef _fault_plan *p = <_fault_plan *>user
    cdef bint hit = False
    cdef long k
    for i in range(3):
        if off < p.hi[i] and off + n > p.lo[i]:
            hit = True
    if not hit:
        return pread(fd, buf, n, <off_t>off)
    k = cb_test_fault_count(&p.faults)
    if p.kind == 1:
        return cb_test_fail_errno(EIO)
    if p.kind == 2:
        return 0
    if p.kind == 3 and k % 2 == 0:
        return cb_test_fail_errno(EINTR)
    if p.kind == 4 and n > 333:
        n = 333
    return pread(fd, buf, n, <off_t>off)


@cython.no_gc_clear  # __dealloc__ may call the unpin callable held in _unpin_fn
cdef class ExpertStore:
    """The expert store over a model's stacked expert tensors (owns a cb_experts_t).

    ExpertStore(desc, mode="mapped", path=None, budget_bytes=0, policy="lru", min_slots=1,
    huge_pages=True, mlock=False, prefetch=False, direct_io=1). Cache and mmap modes read/advise the file
    `path`; the ranges come from the description's validated TensorInfo offsets. prefetch
    starts the store's background thread (cache/mmap), fed by the forward pass's hints."""
    cdef cb_experts_t *s
    cdef object desc
    cdef object _pin_fn, _unpin_fn, _pin_handle, _pin_error
    cdef public object unpin_error
    cdef readonly int n_layers
    cdef readonly str mode, policy
    cdef object _read_fault  # test only: the _ReadFault plan the read hook points at

    def __cinit__(self, desc, str mode="mapped", path=None, budget_bytes=0, str policy="lru",
                  int min_slots=1, bint huge_pages=True, bint mlock=False, bint prefetch=False,
                  int direct_io=1):
        self.s = NULL
        self.desc = desc
        if mode not in _EXPERT_MODES:
            raise ValueError(f"expert mode {mode!r}: expected one of {sorted(_EXPERT_MODES)}")
        if policy not in _POLICIES:
            raise ValueError(f"expert policy {policy!r}: expected one of {sorted(_POLICIES)}")
        if mode != "mapped" and path is None:
            raise ValueError(f"expert mode {mode!r} needs the model path")
        if budget_bytes < 0:
            raise ValueError(f"expert budget {budget_bytes} is negative")
        if direct_io not in (0, 1, 2):
            raise ValueError(f"direct_io {direct_io}: expected 0 (never), 1 (auto) or 2 (always)")
        self.mode, self.policy = mode, policy
        n = len(desc.layers)
        self.n_layers = n
        cdef cb_experts_params_t p = cb_experts_default_params()
        cdef cb_status st = CB_OK
        cdef int32_t nl = <int32_t>n
        cdef cb_experts_t *sp = NULL
        p.mode = _EXPERT_MODES[mode]
        p.policy = _POLICIES[policy]
        p.budget_bytes = <uint64_t>min(int(budget_bytes), 2**63)
        p.min_slots = min_slots
        p.huge_pages = huge_pages
        p.mlock = mlock
        p.prefetch = prefetch and mode != "mapped"
        p.direct_io = direct_io
        bpath = os.fsencode(path) if path is not None else None
        p.path = <const char *>bpath if bpath is not None else NULL
        cdef cb_experts_layer_t *ls = <cb_experts_layer_t *>calloc(n + 1, sizeof(cb_experts_layer_t))
        if ls == NULL:
            raise MemoryError("no memory for the expert table")
        try:
            for i, L in enumerate(desc.layers):
                if L.n_expert == 0 or L.experts is None:
                    continue
                X = L.experts
                ls[i].n_expert = L.n_expert
                ls[i].type_gate = X.gate.type
                ls[i].type_up = X.up.type
                ls[i].type_down = X.down.type
                ls[i].n_embd = desc.n_embd
                ls[i].n_ff = L.n_ff_exp
                ls[i].gate_base = <const uint8_t *>_addr(X.gate_base, np.uint8, "gate_exps")
                ls[i].up_base = <const uint8_t *>_addr(X.up_base, np.uint8, "up_exps")
                ls[i].down_base = <const uint8_t *>_addr(X.down_base, np.uint8, "down_exps")
                ls[i].gate_stride = X.gate_stride
                ls[i].up_stride = X.up_stride
                ls[i].down_stride = X.down_stride
                ls[i].gate_bytes = X.gate.rows * X.gate.row_bytes
                ls[i].up_bytes = X.up.rows * X.up.row_bytes
                ls[i].down_bytes = X.down.rows * X.down.row_bytes
                ls[i].gate_off = X.gate_info.offset
                ls[i].up_off = X.up_info.offset
                ls[i].down_off = X.down_info.offset
            with nogil:
                st = cb_experts_new(&p, ls, nl, &sp)
            self.s = sp
            check(st)
        finally:
            free(ls)

    def info(self):
        """mode, policy, n_slots, n_pinned, prefetch, one_read_layers, direct_io (the cache
        store reads with O_DIRECT), slot_bytes, pool_bytes, expert_bytes."""
        cdef cb_experts_info_t x
        check(cb_experts_info(self.s, &x))
        return {"mode": self.mode, "policy": self.policy, "n_slots": x.n_slots,
                "n_pinned": x.n_pinned, "prefetch": bool(x.prefetch),
                "one_read_layers": x.one_read_layers, "direct_io": bool(x.direct_io),
                "slot_bytes": x.slot_bytes,
                "pool_bytes": x.pool_bytes,
                "expert_bytes": x.expert_bytes}

    cdef int32_t _moe_layer(self, object layer) except -1:
        """A caller's layer index that must name an MoE layer: IndexError outside
        [0, n_layers), ValueError for a layer without experts."""
        cdef int32_t l = _index(layer, self.n_layers, "layer")
        if self.desc.layers[l].n_expert == 0:
            raise ValueError(f"layer {l} has no experts (a dense layer)")
        return l

    def pin(self, layer, expert):
        """Load expert (layer, expert) and never evict it (cache and mmap modes)."""
        cdef int32_t l = self._moe_layer(layer)
        cdef int32_t ne = self.desc.layers[l].n_expert
        e_ = operator.index(expert)
        if not 0 <= e_ < ne:
            raise OutOfRangeError(f"layer {l} has no expert {e_} (expert ids are in [0, {ne}))")
        cdef int32_t e = <int32_t>e_
        cdef cb_status st
        with nogil:
            st = cb_experts_pin(self.s, l, e)
        check(st)

    def __dealloc__(self):
        cb_experts_free(self.s)  # calls the unpin callable first when the pool is pinned
        self.s = NULL

    def pool(self):
        """The cache store's slot pool: {"address", "bytes", "slot_bytes", "n_slots", "pinned"}
        (ColibriError for the mapped and mmap stores, which have none)."""
        cdef cb_experts_pool_t p
        check(cb_experts_pool(self.s, &p))
        return {"address": <uintptr_t>p.base, "bytes": p.bytes, "slot_bytes": p.slot_bytes,
                "n_slots": p.n_slots, "pinned": bool(p.pinned)}

    def pool_view(self):
        """A uint8 numpy view of the whole slot pool; it keeps this store alive."""
        p = self.pool()
        return np.asarray(_PoolBuffer(self, p["address"], p["bytes"]))

    def pin_pool(self, pin, unpin):
        """Pin the slot pool through an outside owner: pin(view) -> handle is called now with a
        uint8 view of the whole pool (valid until unpin); unpin(handle) is called exactly once,
        by unpin_pool() or when the store is freed, before the pool is unmapped. One
        registration at a time."""
        if not callable(pin) or not callable(unpin):
            raise TypeError("pin_pool needs two callables")
        if self._unpin_fn is not None:
            raise ValueError("the expert pool is already pinned (one registration at a time)")
        self._pin_fn, self._unpin_fn, self._pin_error = pin, unpin, None
        cdef cb_status st = cb_experts_pin_pool(self.s, _pool_pin_cb, _pool_unpin_cb,
                                                <void *>self)
        if st != CB_OK:
            self._pin_fn = self._unpin_fn = self._pin_handle = None
            err, self._pin_error = self._pin_error, None
            if err is not None:
                cb_clear_error()
                raise err
            check(st)

    def unpin_pool(self):
        """Undo pin_pool (calls its unpin); nothing when not pinned."""
        cb_experts_unpin_pool(self.s)
        if self.unpin_error is not None:
            err, self.unpin_error = self.unpin_error, None
            raise err

    cdef object _expert_ids(self, int32_t layer, object ids):
        """ids as a contiguous int32 array, each checked against the layer's experts."""
        a = np.asarray(ids).reshape(-1)
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"expert ids must be integers, got {a.dtype}")
        ne = self.desc.layers[layer].n_expert
        if a.size and (a.min() < 0 or a.max() >= ne):
            bad = int(a[(a < 0) | (a >= ne)][0])
            raise OutOfRangeError(f"layer {layer} has no expert {bad} (expert ids are in [0, {ne}))")
        return np.ascontiguousarray(a, dtype=np.int32)

    def acquire(self, layer_index, ids, uses=None):
        """Acquire experts ids of layer: uint64 [n, 3] addresses of each one's gate, up and down
        matrices (inside the slot pool in cache mode), valid until release(layer, ids)."""
        cdef int32_t layer = self._moe_layer(layer_index)
        arr = self._expert_ids(layer, ids)
        cdef int32_t n = <int32_t>arr.shape[0]
        out = np.zeros((max(n, 1), 3), dtype=np.uint64)
        if n == 0:
            return out[:0]
        u = None
        if uses is not None:
            u = np.asarray(uses).reshape(-1)
            if u.shape[0] != n:
                raise ValueError(f"uses has {u.shape[0]} entries for {n} experts")
            if u.size and (u.min() < 0 or u.max() >= 2**31):
                raise ValueError(f"uses must be in [0, 2**31), got {int(u.min())}..{int(u.max())}")
            u = np.ascontiguousarray(u, dtype=np.int32)
        cdef int32_t[::1] v = arr
        cdef int32_t[::1] uv
        cdef const int32_t *up = NULL
        if u is not None:
            uv = u
            up = &uv[0]
        cdef cb_expert_ref_t *refs = <cb_expert_ref_t *>calloc(n, sizeof(cb_expert_ref_t))
        if refs == NULL:
            raise MemoryError("no memory for expert refs")
        cdef cb_status st
        cdef uint64_t[:, ::1] o = out
        try:
            with nogil:
                st = cb_experts_acquire(self.s, layer, &v[0], n, up, refs)
            check(st)
            for i in range(n):
                o[i, 0] = <uintptr_t>refs[i].gate
                o[i, 1] = <uintptr_t>refs[i].up
                o[i, 2] = <uintptr_t>refs[i].down
        finally:
            free(refs)
        return out

    def release(self, layer_index, ids):
        """Give back what acquire(layer, ids) handed out."""
        cdef int32_t layer = self._moe_layer(layer_index)
        arr = self._expert_ids(layer, ids)
        cdef int32_t n = <int32_t>arr.shape[0]
        if n == 0:
            return
        cdef int32_t[::1] v = arr
        check(cb_experts_release(self.s, layer, &v[0], n))

    def stats(self, layer=-1):
        """Hits, misses, bytes read, wait time... of one layer, or all (layer=-1). IndexError
        for any other layer outside [0, n_layers); a dense layer's are all zero."""
        cdef int32_t l = _index(layer, self.n_layers, "layer", True)
        cdef cb_experts_layer_stats_t st
        check(cb_experts_stats(self.s, l, &st))
        return {"uses": st.uses, "acquired": st.acquired, "hits": st.hits, "misses": st.misses,
                "bytes_read": st.bytes_read, "wait_s": st.wait_ns * 1e-9,
                "evictions": st.evictions, "resident": st.resident,
                "resident_bytes": st.resident_bytes, "reads": st.reads,
                "prefetch_issued": st.prefetch_issued, "prefetch_hits": st.prefetch_hits,
                "prefetch_wasted": st.prefetch_wasted, "predicted": st.predicted,
                "predicted_used": st.predicted_used,
                "predicted_acquired": st.predicted_acquired}

    def prefetch(self, layer_index, ids):
        """Hint that layer will use experts ids soon (the store's thread reads them)."""
        cdef int32_t layer = self._moe_layer(layer_index)
        arr = self._expert_ids(layer, ids)
        cdef int32_t[::1] v = arr
        cdef int32_t n = <int32_t>arr.shape[0]
        cdef cb_status st
        with nogil:
            st = cb_experts_prefetch(self.s, layer, &v[0] if n > 0 else NULL, n)
        check(st)

    def prefetch_sync(self):
        """Wait until the prefetch thread has nothing queued or in flight."""
        with nogil:
            cb_experts_prefetch_sync(self.s)

    def route_counts(self, layer_index):
        """How often each expert of a layer was chosen (numpy uint64 [n_expert]). IndexError
        for a layer outside [0, n_layers), ValueError for a layer without experts."""
        cdef int32_t layer = self._moe_layer(layer_index)
        n = self.desc.layers[layer].n_expert
        out = np.zeros(n, dtype=np.uint64)
        cdef uint64_t[::1] v = out
        check(cb_experts_route_counts(self.s, layer, &v[0], <int32_t>n))
        return out

    def reset_stats(self):
        cb_experts_reset_stats(self.s)

    def _test_set_read_fault(self, kind, int layer=0, int expert=0):
        """TEST ONLY (tests/core/test_experts_faults.py): the cache store's reads that touch expert
        (layer, expert) in the file fail from now on: kind "eio" (EIO), "eof" (the file seems
        to end there), "eintr" (every other read interrupted) or "short" (333 bytes at a
        time); None removes the fault. Returns how many reads the previous fault hit."""
        cdef _ReadFault old = self._read_fault
        cdef long hits = old.plan.faults if old is not None else 0
        cdef _ReadFault f
        if kind is None:
            with nogil:  # waits for a prefetch read in flight
                cb_experts_set_read_hook(self.s, NULL, NULL)
            self._read_fault = None
            return hits
        if kind not in _FAULT_KINDS:
            raise ValueError(f"read fault {kind!r}: expected one of {sorted(_FAULT_KINDS)}")
        L = self.desc.layers[layer]
        if L.n_expert == 0 or not 0 <= expert < L.n_expert:
            raise ValueError(f"layer {layer} has no expert {expert}")
        f = _ReadFault()
        f.plan.kind = _FAULT_KINDS[kind]
        X = L.experts
        for i, (info, stride, m) in enumerate(((X.gate_info, X.gate_stride, X.gate),
                                               (X.up_info, X.up_stride, X.up),
                                               (X.down_info, X.down_stride, X.down))):
            f.plan.lo[i] = info.offset + expert * stride
            f.plan.hi[i] = f.plan.lo[i] + m.rows * m.row_bytes
        with nogil:
            cb_experts_set_read_hook(self.s, _fault_read, &f.plan)
        self._read_fault = f  # after the swap: the old plan is no longer read
        return hits


cdef cb_status _moe_trampoline(void *user, int32_t layer, const float *h, const float *logits,
                               int64_t n, float *out) noexcept with gil:
    """cb_moe_hook_fn calling Forward's Python hook(layer, h, logits, out) with numpy views
    (valid for the call only); an exception is kept and re-raised by run()."""
    cdef Forward fw = <Forward>user
    cdef int64_t E = fw.n_embd
    cdef int64_t NE
    try:
        NE = fw.desc.layers[layer].n_expert
        hv = np.asarray(<float[:n * E]><float *>h).reshape(n, E)
        lv = np.asarray(<float[:n * NE]><float *>logits).reshape(n, NE)
        ov = np.asarray(<float[:n * E]>out).reshape(n, E)
        fw._hook(int(layer), hv, lv, ov)
    except BaseException as exc:
        fw._hook_error = exc
        return CB_STATUS_INTERNAL
    return CB_OK


cdef class Forward:
    """One forward-pass context: a model description, a KV cache, an expert store and a thread
    pool (all kept alive by this object), and scratch for max_batch tokens. The store and the
    pool may be None (no MoE layers; the calling thread alone)."""
    cdef cb_forward_t *f
    cdef cb_model_desc_t m
    cdef cb_layer_desc_t *layers
    cdef readonly object desc
    cdef readonly KVCache kv
    cdef readonly ExpertStore experts
    cdef readonly ThreadPool pool
    cdef readonly int max_batch, n_vocab, n_embd
    cdef object _hook, _hook_error

    def __cinit__(self, desc, KVCache kv not None, ExpertStore experts, ThreadPool pool,
                  int max_batch=512):
        self.f = NULL
        self.layers = NULL
        self.desc, self.kv, self.experts, self.pool = desc, kv, experts, pool
        self.max_batch = max_batch
        self.n_vocab = desc.n_vocab
        self.n_embd = desc.n_embd
        # the structs as the descriptions hold them (filled by name in _desc.pxi)
        cdef CModelDesc md = desc
        cdef CLayerDesc ld
        memcpy(&self.m, md.c, sizeof(cb_model_desc_t))
        layers = desc.layers
        n = len(layers)
        if n != self.m.n_layer:
            raise ValueError(f"the description has {n} layers for n_layer = {self.m.n_layer}")
        self.layers = <cb_layer_desc_t *>calloc(n + 1, sizeof(cb_layer_desc_t))
        if self.layers == NULL:
            raise MemoryError("no memory for the layer table")
        for i, D in enumerate(layers):
            ld = D
            memcpy(&self.layers[i], ld.c, sizeof(cb_layer_desc_t))
        self.m.layers = self.layers
        kv._open()
        check(cb_forward_new(&self.m, kv._kv, experts.s if experts is not None else NULL,
                             pool.pool if pool is not None else NULL, max_batch, &self.f))

    def __dealloc__(self):
        cb_forward_free(self.f)
        self.f = NULL
        free(self.layers)
        self.layers = NULL

    def set_moe_hook(self, hook):
        """Run the routed experts of every MoE layer in hook(layer, h, logits, out) instead of
        the expert store: h [n, n_embd] and logits [n, n_expert] float32 (read-only, valid for
        the call), out [n, n_embd] float32 zeroed, to fill with the weighted expert sum. The
        forward still adds shared experts. None restores the expert store."""
        if hook is not None and not callable(hook):
            raise TypeError("the MoE hook must be callable or None")
        self._hook = hook
        if hook is None:
            cb_forward_set_moe_hook(self.f, NULL, NULL)
        else:
            cb_forward_set_moe_hook(self.f, _moe_trampoline, <void *>self)

    def set_deterministic(self, bint deterministic):
        """True (the default): batch-invariant matmuls, a token's logits bit-identical whatever
        its batch; False: the faster kernels that are not (cb_forward_set_deterministic)."""
        cb_forward_set_deterministic(self.f, 1 if deterministic else 0)

    cdef _forward(self, const cb_batch_t *b, float *op):
        """cb_forward_run with the GIL released; then a MoE hook's exception, or the status."""
        cdef cb_status st
        self._hook_error = None
        with nogil:
            st = cb_forward_run(self.f, b, op)
        if self._hook_error is not None:
            exc, self._hook_error = self._hook_error, None
            raise exc
        check(st)

    def decode_one(self, seq, token, int64_t ctx):
        """One token appended to one sequence at its next position, the sequence's length
        (Model.eval's decode step): run()'s checks without its arrays, which cost ~0.2 ms a
        step once the step's weight stream has flushed the caches (docs/benchmarks.md). Returns
        float32 [1, n_vocab], or None when the token would take the sequence past ctx tokens
        (the caller raises its error)."""
        cdef uint32_t s = _seq_id(seq)
        v = operator.index(token)
        if v < 0 or v >= self.n_vocab:
            raise ValueError(f"token id {v} is out of range [0, {self.n_vocab})")
        cdef int32_t t = <int32_t>v
        self.kv._open()
        cdef size_t length = 0
        check(cb_kvcache_seq_len(self.kv._kv, s, &length))
        if <int64_t>length + 1 > ctx or length >= (1u << 31) - 1:
            return None
        cdef int32_t p = <int32_t>length
        cdef cb_batch_t b
        memset(&b, 0, sizeof(cb_batch_t))
        b.n_tokens = 1
        b.tokens = &t
        b.seq = &s
        b.pos = &p
        out = np.empty((1, self.n_vocab), dtype=np.float32)
        cdef float *op = <float *><uintptr_t>out.ctypes.data
        self._forward(&b, op)
        return out

    def run(self, seq, pos, tokens=None, embd=None, logits=None):
        """Run one batch. seq, pos: int arrays [n]; tokens int [n] or embd float32 [n, n_embd];
        logits: bool [n] (which tokens get logits; None = all). Returns float32 [n_wanted, n_vocab]."""
        s = _int_array(seq, "sequence id", 0, 1 << 32, np.uint32)
        p = _int_array(pos, "position", 0, 1 << 31, np.int32)
        n = s.shape[0]
        if p.shape[0] != n:
            raise ValueError(f"seq has {n} entries but pos has {p.shape[0]}")
        if n < 1 or n > self.max_batch:
            raise ValueError(f"a batch holds 1..{self.max_batch} tokens, got {n}")
        if (tokens is None) == (embd is None):
            raise ValueError("give exactly one of tokens and embd")
        cdef cb_batch_t b
        memset(&b, 0, sizeof(cb_batch_t))
        t = e = w = None
        if tokens is not None:
            t = _int_array(tokens, "token id", 0, self.n_vocab, np.int32)
            if t.shape[0] != n:
                raise ValueError(f"{t.shape[0]} tokens for {n} positions")
            b.tokens = <const int32_t *><uintptr_t>t.ctypes.data
        else:
            e = np.ascontiguousarray(embd, dtype=np.float32)
            if e.ndim == 1 and n == 1:
                e = e.reshape(1, -1)
            if e.shape != (n, self.n_embd):
                raise ValueError(f"embeddings of shape {e.shape}, expected ({n}, {self.n_embd})")
            b.embd = <const float *><uintptr_t>e.ctypes.data
        nw = n
        if logits is not None:
            w = np.ascontiguousarray(np.asarray(logits).reshape(-1) != 0, dtype=np.int8)
            if w.shape[0] != n:
                raise ValueError(f"logits mask has {w.shape[0]} entries for {n} tokens")
            nw = int(np.count_nonzero(w))
            b.logits = <const int8_t *><uintptr_t>w.ctypes.data
        b.n_tokens = <int32_t>n
        b.seq = <const uint32_t *><uintptr_t>s.ctypes.data
        b.pos = <const int32_t *><uintptr_t>p.ctypes.data
        out = np.empty((max(nw, 1), self.n_vocab), dtype=np.float32)
        cdef float *op = <float *><uintptr_t>out.ctypes.data
        self._forward(&b, op)
        return out[:nw]
