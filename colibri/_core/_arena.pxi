"""The KV arena (a buddy allocator over one mmap'd region) and the KV cache on top of it.

See include/colibri/arena.h for the allocator, the backings and the K/V layout. Every C call
runs without the GIL; the C side has its own mutexes, so any thread may call any method.

Views: KVArena.view() returns a zero-copy, writable memoryview that pins the mapping, so
close() never unmaps memory a view still points at (it is unmapped when the last view is
released). A view of a block that is later freed, or moved by grow(), shows whatever the
arena puts there next: like a pointer, it follows the offset, not the data.
"""

cimport cython
from cpython.buffer cimport PyBuffer_FillInfo
from libc.stdint cimport uint8_t, uint32_t, uintptr_t

from colibri._core.arena cimport *
from colibri._core.status cimport cb_fail

import operator

import numpy as np

_HUGEPAGES = {"auto": CB_HUGEPAGES_AUTO, "off": CB_HUGEPAGES_OFF, "on": CB_HUGEPAGES_ON}
_BACKINGS = {"anon": CB_BACKING_ANON, "shm": CB_BACKING_SHM}
_SIZE_LIMIT = 1 << 62


cdef size_t _nonneg(object value, str what) except? 0:
    v = operator.index(value)
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v}")
    if v >= _SIZE_LIMIT:
        raise ValueError(f"{what} {v} is out of range")
    return <size_t>v


cdef uint32_t _seq_id(object seq) except? 0:
    v = operator.index(seq)
    if v < 0 or v >= (1 << 32):
        raise ValueError(f"sequence {v} is not live")
    return <uint32_t>v


@cython.no_gc_clear
cdef class _ArenaView:
    """Owner of one pinned range of an arena; exported through a memoryview."""
    cdef KVArena arena
    cdef void *ptr
    cdef Py_ssize_t n
    cdef bint pinned

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.ptr, self.n, 0, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    def __dealloc__(self):
        if self.pinned and self.arena is not None:
            cb_arena_unpin(self.arena._a)
            self.pinned = False


cdef class KVArena:
    """A contiguous mmap'd region managed by a binary buddy allocator.

    KVArena(capacity, min_block=4096, hugepages="auto", lock=False, backing="anon", exact=True)

    capacity is rounded up to a multiple of min_block (a power of two >= 64). hugepages:
    "auto" (hugetlb 2 MiB pages if enough are free, else transparent huge pages, else plain
    pages; stats()["backing_note"] says why), "off", or "on" (hugetlb or ColibriError).
    backing: "anon" or "shm" (an unlinked file in /dev/shm, reserved up front). lock=True
    mlocks the region (MemoryError naming RLIMIT_MEMLOCK / `ulimit -l` when over the limit).
    exact=True returns the unused tail of each buddy block (waste < min_block per block);
    exact=False is the classic power-of-two buddy.
    Errors leave the arena unchanged; any use after close() raises ColibriError.
    """
    cdef cb_arena_t *_a
    cdef readonly size_t capacity
    cdef readonly size_t min_block
    cdef bint _closed

    def __cinit__(self, capacity, min_block=4096, hugepages="auto", lock=False,
                  backing="anon", exact=True):
        self._a = NULL
        self._closed = True
        cap = operator.index(capacity)
        if cap <= 0:
            raise ValueError(f"capacity must be > 0 bytes, got {cap}")
        if cap >= _SIZE_LIMIT:
            raise ValueError(f"capacity {cap} is out of range")
        mb = operator.index(min_block)
        if mb < 64 or mb & (mb - 1) or mb > (1 << 30):
            raise ValueError(f"min_block must be a power of two between 64 and 2**30, got {mb}")
        if hugepages is True:
            hugepages = "on"
        elif hugepages is False or hugepages is None:
            hugepages = "off"
        if hugepages not in _HUGEPAGES:
            raise ValueError(f"hugepages must be 'auto', 'on' or 'off', got {hugepages!r}")
        if backing not in _BACKINGS:
            raise ValueError(f"backing must be 'anon' or 'shm', got {backing!r}")
        cdef cb_arena_params p = cb_arena_default_params()
        p.capacity = <size_t>cap
        p.min_block = <size_t>mb
        p.hugepages = <cb_arena_hugepages>_HUGEPAGES[hugepages]
        p.backing = <cb_arena_backing>_BACKINGS[backing]
        p.lock = 1 if lock else 0
        p.exact = 1 if exact else 0
        cdef cb_arena_t *a = NULL
        cdef cb_status s
        with nogil:
            s = cb_arena_new(&p, &a)
        check(s)
        self._a = a
        self._closed = False
        cdef cb_arena_stats_t st
        check(cb_arena_stats(a, &st))
        self.capacity = st.capacity
        self.min_block = st.min_block

    def __dealloc__(self):
        if self._a != NULL:
            cb_arena_free(self._a)
            self._a = NULL

    @property
    def closed(self):
        """True after close()."""
        return self._closed

    def _largest_free(self):
        cdef cb_arena_stats_t st
        check(cb_arena_stats(self._a, &st))
        return st.largest_free

    def alloc(self, n):
        """Allocate a block of n > 0 bytes; returns its byte offset."""
        v = operator.index(n)
        if v <= 0:
            raise ValueError(f"alloc size must be > 0 bytes, got {v}")
        if v >= _SIZE_LIMIT:
            raise MemoryError(f"arena: cannot allocate {v} bytes: the largest free block is "
                              f"{self._largest_free()} bytes")
        cdef size_t nn = <size_t>v, off = 0
        cdef cb_status s
        with nogil:
            s = cb_arena_alloc(self._a, nn, &off)
        check(s)
        return off

    def free(self, offset):
        """Free the live block at offset (ValueError if it is not one)."""
        cdef size_t off = _nonneg(offset, "offset")
        cdef cb_status s
        with nogil:
            s = cb_arena_free_block(self._a, off)
        check(s)

    def grow(self, offset, n):
        """Resize the live block at offset to n > 0 bytes, in place when possible, else moved
        with its contents (the first min(n, old size) bytes). Returns the new offset. On
        MemoryError the block, its data and the arena are unchanged."""
        cdef size_t off = _nonneg(offset, "offset")
        v = operator.index(n)
        if v <= 0:
            raise ValueError(f"grow size must be > 0 bytes, got {v}")
        if v >= _SIZE_LIMIT:
            raise MemoryError(f"arena: cannot grow a block to {v} bytes: the largest free "
                              f"block is {self._largest_free()} bytes")
        cdef size_t nn = <size_t>v, new_off = 0
        cdef cb_status s
        with nogil:
            s = cb_arena_grow(self._a, off, nn, &new_off)
        check(s)
        return new_off

    def block_info(self, offset):
        """(requested bytes, block bytes) of the live block at offset."""
        cdef size_t off = _nonneg(offset, "offset"), req = 0, blk = 0
        check(cb_arena_block_info(self._a, off, &req, &blk))
        return (req, blk)

    def stats(self):
        """capacity, used, free, largest_free, n_blocks, n_free_blocks, requested,
        internal_waste (used - requested), external_fragmentation (1 - largest_free/free),
        min_block, n_roots, mapped, exact, locked, backing, backing_note."""
        cdef cb_arena_stats_t st
        cdef cb_status s
        with nogil:
            s = cb_arena_stats(self._a, &st)
        check(s)
        return {
            "capacity": st.capacity,
            "used": st.used,
            "free": st.free,
            "largest_free": st.largest_free,
            "n_blocks": st.n_blocks,
            "n_free_blocks": st.n_free_blocks,
            "requested": st.requested,
            "internal_waste": st.internal_waste,
            "external_fragmentation": st.external_fragmentation,
            "min_block": st.min_block,
            "n_roots": st.n_roots,
            "mapped": st.mapped,
            "exact": bool(st.exact),
            "locked": bool(st.locked),
            "backing": st.backing.decode("ascii"),
            "backing_note": st.backing_note.decode("utf-8", "replace"),
        }

    def view(self, offset, n):
        """Zero-copy writable memoryview of [offset, offset+n), which must lie inside the
        requested bytes of one live block. The mapping stays valid while the view lives."""
        cdef size_t off = _nonneg(offset, "offset"), nn = _nonneg(n, "view size")
        cdef void *ptr = NULL
        cdef cb_status s
        with nogil:
            s = cb_arena_view(self._a, off, nn, &ptr)
        check(s)
        cdef _ArenaView v = _ArenaView.__new__(_ArenaView)
        v.arena = self
        v.ptr = ptr
        v.n = <Py_ssize_t>nn
        v.pinned = True
        return memoryview(v)

    def check(self):
        """Verify every allocator invariant; ColibriError naming the first broken one."""
        cdef cb_status s
        with nogil:
            s = cb_arena_check(self._a)
        check(s)

    def compact(self, offsets, up=False):
        """Slide the live blocks at offsets (strictly increasing) down (or up) into the free
        stretch next to each, data moved with them; returns their new offsets. Blocks not
        listed stay. ValueError (nothing moved) for a non-live offset or a wrong order."""
        offs = [_nonneg(o, "offset") for o in offsets]
        cdef size_t n = len(offs)
        cdef size_t[::1] v = np.array(offs if n else [0], dtype=np.uintp)
        cdef int u = 1 if up else 0
        cdef cb_status s
        with nogil:
            s = cb_arena_compact(self._a, &v[0], n, u)
        check(s)
        return [int(v[i]) for i in range(n)]

    def close(self):
        """Release the region (deferred while views exist). Idempotent."""
        if self._a != NULL:
            with nogil:
                cb_arena_close(self._a)
        self._closed = True

    def __enter__(self):
        if self._closed:
            check(cb_fail(CB_STATUS_CLOSED, "arena: the arena is closed"))
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self._closed:
            return f"<KVArena closed capacity={self.capacity}>"
        st = self.stats()
        return (f"<KVArena capacity={st['capacity']} used={st['used']} "
                f"blocks={st['n_blocks']} backing={st['backing']}>")


def _kv_dtype(dtype):
    if isinstance(dtype, str) and dtype.lower() in ("f32", "float32"):
        return CB_KV_F32, np.dtype(np.float32)
    if isinstance(dtype, str) and dtype.lower() in ("f16", "float16", "half"):
        return CB_KV_F16, np.dtype(np.float16)
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt == np.dtype(np.float32):
        return CB_KV_F32, dt
    if dt == np.dtype(np.float16):
        return CB_KV_F16, dt
    raise ValueError(f"KVCache dtype must be 'f32' or 'f16' (numpy float32/float16), got {dtype!r}")


def _dim(value, str what):
    v = operator.index(value)
    if v <= 0 or v >= (1 << 31):
        raise ValueError(f"{what} must be in [1, 2**31), got {v}")
    return v


@cython.no_gc_clear
cdef class KVCache:
    """Per-sequence K/V storage in a KVArena: one arena block per sequence.

    KVCache(arena, n_layers, n_kv_heads, head_dim, dtype="f16", *, max_sequences=1024,
            chunk_tokens=16, doubling=False, page_tokens=256, state_bytes=0)

    state_bytes > 0: each sequence also owns that many bytes of recurrent state (linear
    attention: arena.h), zeroed when made; get_state()/set_state() copy it out and in (a prefix
    snapshot); lengths cannot be truncated but to 0 (which zeroes it).

    Layout (include/colibri/arena.h): token_stride = n_layers * 2 * n_kv_heads * head_dim *
    itemsize bytes a token; a sequence's block is pages of page_tokens tokens (the last may hold
    fewer), and inside a page each (layer, K or V, kv_head)'s head_dim-value rows of the page's
    tokens are one run, so attention streams a head's keys. page_tokens=1: position-major, a
    token's [layer][K, V][kv_head][head_dim] together. keys()/values() copy a layer out,
    set_keys()/set_values() copy into it. reserve() grows the block in steps of
    chunk_tokens (or at least doubling the capacity with doubling=True); when the cache is full
    it tries the exact count, then gives back every sequence's rounding and compacts the cache
    (moving other sequences' blocks) and tries again; else MemoryError saying how full the
    cache is, and the sequence's length and tokens are unchanged. The cache keeps its arena
    alive.
    """
    cdef cb_kvcache_t *_kv
    cdef readonly KVArena arena
    cdef readonly int n_layers
    cdef readonly int n_kv_heads
    cdef readonly int head_dim
    cdef readonly object dtype
    cdef readonly size_t token_stride
    cdef readonly size_t page_tokens
    cdef readonly size_t state_bytes
    cdef size_t _elt
    cdef bint _closed

    def __cinit__(self, KVArena arena not None, n_layers, n_kv_heads, head_dim, dtype="f16", *,
                  max_sequences=1024, chunk_tokens=16, doubling=False, page_tokens=256,
                  state_bytes=0):
        self._kv = NULL
        self._closed = True
        self.arena = arena
        code, dt = _kv_dtype(dtype)
        cdef cb_kvcache_params p = cb_kvcache_default_params()
        p.n_layers = <uint32_t>_dim(n_layers, "n_layers")
        p.n_kv_heads = <uint32_t>_dim(n_kv_heads, "n_kv_heads")
        p.head_dim = <uint32_t>_dim(head_dim, "head_dim")
        p.dtype = <cb_kv_dtype>code
        ms = operator.index(max_sequences)
        if ms <= 0 or ms > (1 << 24):
            raise ValueError(f"max_sequences must be in [1, 2**24], got {ms}")
        p.max_sequences = <uint32_t>ms
        p.chunk_tokens = <uint32_t>_dim(chunk_tokens, "chunk_tokens")
        p.doubling = 1 if doubling else 0
        pt = operator.index(page_tokens)
        if pt <= 0 or pt > (1 << 20):
            raise ValueError(f"page_tokens must be in [1, 2**20], got {pt}")
        p.page_tokens = <uint32_t>pt
        sb = operator.index(state_bytes)
        if sb < 0 or sb > (1 << 40):
            raise ValueError(f"state_bytes must be in [0, 2**40], got {sb}")
        p.state_bytes = <size_t>sb
        if arena.closed:
            check(cb_fail(CB_STATUS_CLOSED, "KVCache: the arena is closed"))
        cdef cb_kvcache_t *kv = NULL
        check(cb_kvcache_new(arena._a, &p, &kv))
        self._kv = kv
        self._closed = False
        self.n_layers = p.n_layers
        self.n_kv_heads = p.n_kv_heads
        self.head_dim = p.head_dim
        self.dtype = dt
        self._elt = dt.itemsize
        self.token_stride = cb_kvcache_token_stride(kv)
        self.page_tokens = cb_kvcache_page_tokens(kv)
        self.state_bytes = cb_kvcache_state_bytes(kv)

    def __dealloc__(self):
        if self._kv != NULL:
            cb_kvcache_free(self._kv)
            self._kv = NULL

    cdef int _open(self) except -1:
        if self._closed:
            check(cb_fail(CB_STATUS_CLOSED, "kvcache: the cache is closed"))
        return 0

    @property
    def closed(self):
        return self._closed

    def new_sequence(self):
        """A new empty sequence; returns its id."""
        self._open()
        cdef uint32_t seq = 0
        check(cb_kvcache_seq_new(self._kv, &seq))
        return seq

    def reserve(self, seq, n_tokens):
        """Make room for n_tokens tokens (may move the block; the length is unchanged)."""
        self._open()
        cdef uint32_t s = _seq_id(seq)
        cdef size_t n = _nonneg(n_tokens, "n_tokens")
        cdef cb_status st
        with nogil:
            st = cb_kvcache_seq_reserve(self._kv, s, n)
        check(st)

    def copy_prefix(self, src, dst, n_tokens, state=None):
        """Copy the K and V (every layer) of src's first n_tokens tokens into dst, reserving dst
        for them, and set dst's length to n_tokens. ValueError when src or dst is not live,
        src == dst or n_tokens > length(src); MemoryError (dst unchanged) when the cache
        cannot hold them. Like reserve, it may move every sequence's block. With a recurrent
        state (state_bytes): dst's state is src's when n_tokens is src's length, else state
        (a get_state() snapshot of src after n_tokens) must be given."""
        self._open()
        cdef uint32_t s = _seq_id(src), d = _seq_id(dst)
        cdef size_t n = _nonneg(n_tokens, "n_tokens")
        cdef cb_status st
        cdef const unsigned char[::1] v
        cdef const void *p = NULL
        if state is not None:
            v = bytes(state)
            if v.shape[0] != <Py_ssize_t>self.state_bytes or self.state_bytes == 0:
                raise ValueError(f"state of {v.shape[0]} bytes for a cache with state_bytes "
                                 f"{self.state_bytes}")
            p = &v[0]
        with nogil:
            if p != NULL:
                st = cb_kvcache_copy_prefix_state(self._kv, s, d, n, p)
            else:
                st = cb_kvcache_copy_prefix(self._kv, s, d, n)
        check(st)

    def get_state(self, seq):
        """A copy of the sequence's recurrent state (bytes; state_bytes of them)."""
        self._open()
        buf = bytearray(self.state_bytes)
        cdef unsigned char[::1] v = buf
        check(cb_kvcache_state_get(self._kv, _seq_id(seq), &v[0] if self.state_bytes else NULL))
        return bytes(buf)

    def set_state(self, seq, state):
        """Overwrite the sequence's recurrent state with a copy from get_state()."""
        self._open()
        cdef const unsigned char[::1] v = bytes(state)
        if v.shape[0] != <Py_ssize_t>self.state_bytes or self.state_bytes == 0:
            raise ValueError(f"state of {v.shape[0]} bytes for a cache with state_bytes "
                             f"{self.state_bytes}")
        check(cb_kvcache_state_set(self._kv, _seq_id(seq), &v[0]))

    def free_sequence(self, seq):
        """Free the sequence's block and id."""
        self._open()
        cdef uint32_t s = _seq_id(seq)
        cdef cb_status st
        with nogil:
            st = cb_kvcache_seq_free(self._kv, s)
        check(st)

    def length(self, seq):
        """Tokens written (set by set_length)."""
        self._open()
        cdef size_t n = 0
        check(cb_kvcache_seq_len(self._kv, _seq_id(seq), &n))
        return n

    def set_length(self, seq, n):
        """Set the length; ValueError beyond capacity(seq)."""
        self._open()
        check(cb_kvcache_seq_set_len(self._kv, _seq_id(seq), _nonneg(n, "length")))

    def capacity(self, seq):
        """Tokens that fit without another reserve."""
        self._open()
        cdef size_t n = 0
        check(cb_kvcache_seq_capacity(self._kv, _seq_id(seq), &n))
        return n

    def offset(self, seq):
        """Arena byte offset of the sequence's block, or None before its first reserve."""
        self._open()
        cdef size_t off = 0
        cdef int has = 0
        check(cb_kvcache_seq_offset(self._kv, _seq_id(seq), &off, &has))
        return off if has else None

    def token_offset(self, seq, pos, layer, kv_index, head=0):
        """Arena byte offset of the row of K (kv_index 0) or V (1) of token pos, layer and
        kv_head `head` (what the C cb_kvcache_row_ptr returns, minus the arena base)."""
        self._open()
        cdef void *ptr = NULL
        cdef uint32_t l, k, h
        lv = operator.index(layer)
        kvi = operator.index(kv_index)
        hv = operator.index(head)
        if lv < 0 or lv >= self.n_layers or kvi not in (0, 1) or hv < 0 or hv >= self.n_kv_heads:
            raise ValueError(f"layer {lv} (of {self.n_layers}), kv_index {kvi} or head {hv} "
                             f"(of {self.n_kv_heads}) out of range")
        l = <uint32_t>lv
        k = <uint32_t>kvi
        h = <uint32_t>hv
        check(cb_kvcache_row_ptr(self._kv, _seq_id(seq), _nonneg(pos, "pos"), l, k, h, &ptr))
        return <size_t>(<uintptr_t>ptr - <uintptr_t>cb_arena_base(self.arena._a))

    def sequences(self):
        """Live sequence ids, increasing."""
        self._open()
        cdef size_t n = cb_kvcache_list(self._kv, NULL, 0)
        cdef uint32_t[::1] ids = np.zeros(max(n, 1), dtype=np.uint32)
        n = cb_kvcache_list(self._kv, &ids[0], n)
        return [int(ids[i]) for i in range(min(n, ids.shape[0]))]

    cdef uint32_t _layer(self, layer) except? 0xFFFFFFFF:
        lv = operator.index(layer)
        if lv < 0 or lv >= self.n_layers:
            raise ValueError(f"layer {lv} out of range (n_layers {self.n_layers})")
        return <uint32_t>lv

    def _read(self, seq, layer, uint32_t kv_index):
        self._open()
        cdef uint32_t l = self._layer(layer), s = _seq_id(seq)
        cdef size_t n = 0
        check(cb_kvcache_seq_len(self._kv, s, &n))
        out = np.empty((n, self.n_kv_heads, self.head_dim), dtype=self.dtype)
        cdef char[::1] buf = out.reshape(-1).view(np.int8) if n else np.zeros(1, np.int8)
        cdef cb_status st
        with nogil:
            st = cb_kvcache_read(self._kv, s, l, kv_index, 0, n, &buf[0])
        check(st)
        return out

    def _write(self, seq, layer, uint32_t kv_index, data, start):
        self._open()
        cdef uint32_t l = self._layer(layer), s = _seq_id(seq)
        cdef size_t at = _nonneg(start, "start")
        a = np.ascontiguousarray(data, dtype=self.dtype)
        if a.ndim != 3 or a.shape[1:] != (self.n_kv_heads, self.head_dim):
            raise ValueError(f"data must have shape [n, {self.n_kv_heads}, {self.head_dim}], got "
                             f"{list(a.shape)}")
        cdef size_t n = a.shape[0]
        cdef const char[::1] buf = a.reshape(-1).view(np.int8) if n else np.zeros(1, np.int8)
        cdef cb_status st
        with nogil:
            st = cb_kvcache_write(self._kv, s, l, kv_index, at, n, &buf[0])
        check(st)

    def keys(self, seq, layer):
        """A copy of layer's K of the sequence's tokens: [length, n_kv_heads, head_dim]."""
        return self._read(seq, layer, 0)

    def values(self, seq, layer):
        """Like keys(), for V."""
        return self._read(seq, layer, 1)

    def set_keys(self, seq, layer, data, start=0):
        """Write layer's K of tokens [start, start + n) from data [n, n_kv_heads, head_dim]
        (converted to the cache's dtype); they must be within capacity(seq) (reserve first), the
        length is not changed (set_length). ValueError otherwise, nothing written."""
        self._write(seq, layer, 0, data, start)

    def set_values(self, seq, layer, data, start=0):
        """Like set_keys(), for V."""
        self._write(seq, layer, 1, data, start)

    def close(self):
        """Free every sequence's block. Idempotent; later calls raise ColibriError."""
        if self._kv != NULL:
            with nogil:
                cb_kvcache_close(self._kv)
        self._closed = True

    def __enter__(self):
        self._open()
        return self

    def __exit__(self, *exc):
        self.close()
        return False
