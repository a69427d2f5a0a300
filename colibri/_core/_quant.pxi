"""GGUF block types and the CPU kernels (include/colibri/quant.h) over numpy arrays.

Weights are passed as their raw bytes (a uint8 array laid out as in a GGUF file: `rows` rows
of `cols` values each), activations as float32 arrays. Every kernel call releases the GIL.
Used by the tests and tools; the forward pass calls the C API directly.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t

import numpy as np

from colibri._core.quant cimport (
    cb_dequantize_rows, cb_get_rows, cb_matmul_default_opts, cb_matmul_ex, cb_matmul_opts_t,
    cb_matrix_check, cb_matrix_t, cb_pack_r16, cb_r16_bytes, cb_r16_layout, cb_quantize_i4g128, cb_quantize_q8_0, cb_type_block_bytes, cb_type_block_size,
    cb_type_name, cb_type_row_bytes, cb_type_supported,
)
from colibri._core.threadpool cimport (
    CB_THREADPOOL_MAX_THREADS, cb_threadpool_free, cb_threadpool_n_threads, cb_threadpool_new,
    cb_threadpool_t,
)

# name -> id of every block type of include/colibri/quant.h (the IntEnum cb_type)
TYPES = {t.name[len("CB_TYPE_"):]: int(t) for t in cb_type}
# colibri's own block types (not GGML ids; never in a GGUF file)
COLIBRI_TYPES = ("I4_G128",)
# colibri's in-memory layouts of a block type (not a type of their own: no file holds them, and
# dequantize does not read them; get_rows and matmul do)
LAYOUTS = ("Q8_0_R16", "Q5_0_R16", "Q6_K_R16", "Q4_K_R16")
SUPPORTED = tuple(n for n, i in TYPES.items() if cb_type_supported(i) and n not in LAYOUTS)


def type_id(t):
    """GGML type id of `t`: an int (or gguf.GGMLQuantizationType) or a name such as 'Q4_K'."""
    if isinstance(t, str):
        try:
            return TYPES[t.upper()]
        except KeyError:
            raise ValueError(f"unknown block type {t!r}; known: {', '.join(TYPES)}") from None
    i = int(t)
    if not -2**31 <= i < 2**31 or cb_type_block_size(i) == 0:
        raise ValueError(f"unknown GGML type id {i}")
    return i


def type_name(t):
    return cb_type_name(type_id(t)).decode("ascii")


def block_size(t):
    return cb_type_block_size(type_id(t))


def block_bytes(t):
    return cb_type_block_bytes(type_id(t))


def supported(t):
    return bool(cb_type_supported(type_id(t)))


def row_bytes(t, int64_t n):
    """Bytes of a row of n values; ValueError when n is not a multiple of the block size."""
    cdef size_t out = 0
    check(cb_type_row_bytes(type_id(t), n, &out))
    return out


# Most threads a ThreadPool may have (include/colibri/threadpool.h).
THREADPOOL_MAX_THREADS = CB_THREADPOOL_MAX_THREADS


cdef class ThreadPool:
    """A persistent pool of n threads (the calling thread included) for the kernels."""
    cdef cb_threadpool_t *pool

    def __cinit__(self, int n_threads=1):
        self.pool = NULL
        check(cb_threadpool_new(n_threads, &self.pool))

    def __dealloc__(self):
        cb_threadpool_free(self.pool)
        self.pool = NULL

    @property
    def n_threads(self):
        return cb_threadpool_n_threads(self.pool)


def _as_bytes(raw):
    """The bytes of `raw` (any C-contiguous array or buffer, read-only ones included, e.g. a
    mapped GGUF tensor) as a flat uint8 array, without converting values."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    arr = np.ascontiguousarray(raw)
    return arr.reshape(-1).view(np.uint8)


cdef _raw_matrix(cb_matrix_t *m, int type, raw, int64_t rows, int64_t cols):
    """Fill m from a uint8 array of exactly rows*row_bytes bytes; returns the contiguous array."""
    if rows < 0 or cols < 0:
        raise ValueError(f"negative shape ({rows}, {cols})")
    rb = row_bytes(type, cols)
    if not cb_type_supported(type):
        raise ValueError(f"block type {type_name(type)} is not supported by the kernels")
    arr = _as_bytes(raw)
    need = cb_r16_bytes(type, rows, cols) if type_name(type) in LAYOUTS else rows * rb
    if arr.size != need:
        raise ValueError(
            f"{type_name(type)} weight of shape ({rows}, {cols}) needs {need} bytes, "
            f"got {arr.size}")
    cdef const uint8_t[::1] view = arr
    m.type = type
    m.rows = rows
    m.cols = cols
    m.row_bytes = rb
    m.data = &view[0] if arr.size > 0 else NULL
    check(cb_matrix_check(m))
    return arr


def dequantize(t, raw, shape):
    """Dequantize raw blocks (uint8) of type t to a float32 array of `shape` (last dim: a row)."""
    cdef int type = type_id(t)
    if type_name(type) in LAYOUTS:
        raise ValueError(f"{type_name(type)} is a 16-row layout, not a run of blocks: read its "
                         "rows with get_rows")
    shape = tuple(int(s) for s in np.atleast_1d(shape)) if not isinstance(shape, int) else (shape,)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative shape {shape}")
    n = int(np.prod(shape, dtype=np.int64))
    cols = shape[len(shape) - 1] if shape else 1
    rb = row_bytes(type, cols)
    if not cb_type_supported(type):
        raise ValueError(f"block type {type_name(type)} is not supported by the kernels")
    arr = _as_bytes(raw)
    rows = n // cols if cols else 0
    if arr.size != rows * rb:
        raise ValueError(f"{type_name(type)} of shape {shape} needs {rows * rb} bytes, got {arr.size}")
    out = np.empty(shape, dtype=np.float32)
    if n == 0:
        return out
    cdef const uint8_t[::1] src = arr
    cdef float[::1] dst = out.reshape(-1)
    cdef int64_t nn = n
    with nogil:
        s = cb_dequantize_rows(type, &src[0], nn, &dst[0])
    check(s)
    return out


def get_rows(t, raw, int64_t rows, int64_t cols, ids):
    """Rows `ids` of a (rows, cols) weight of type t, dequantized: float32 [len(ids), cols]."""
    cdef cb_matrix_t m
    cdef int type = type_id(t)
    keep = _raw_matrix(&m, type, raw, rows, cols)
    ids_arr = np.asarray(ids)
    if ids_arr.ndim != 1:
        raise ValueError("ids must be one-dimensional")
    if ids_arr.size and (ids_arr.min() < -2**31 or ids_arr.max() >= 2**31):
        raise ValueError("ids out of int32 range")
    ids32 = np.ascontiguousarray(ids_arr, dtype=np.int32)
    out = np.empty((ids32.size, cols), dtype=np.float32)
    if ids32.size == 0 or cols == 0:
        if ids32.size and rows == 0:
            raise ValueError(f"get_rows: id {int(ids32[0])} out of range [0, 0)")
        return out
    cdef const int32_t[::1] iv = ids32
    cdef float[:, ::1] ov = out
    cdef int64_t n = ids32.size
    with nogil:
        s = cb_get_rows(&m, &iv[0], n, &ov[0, 0])
    check(s)
    del keep
    return out


def matmul(t, raw, int64_t rows, int64_t cols, x, ThreadPool pool=None, int threads=1,
           out=None, bint accumulate=False, token_scale=None, token_ids=None, packed=None,
           bint fast=False):
    """y = x @ W.T for a (rows, cols) weight W of type t given as raw bytes.

    x: float32 [n_tokens, cols] (or [cols] for a single token). Returns float32
    [n_tokens, rows] (or [rows]). `pool` (a ThreadPool) or `threads` (a pool made for this
    call) splits rows across threads. With `out`, writes (or with accumulate=True adds) into it.
    token_scale: float32 [n_tokens] factors; token_ids: int32 [n_tokens] rows of x and out that
    token t reads and writes (then x and out have any number of rows and out is required).
    packed: None = the packed-row path when the batch is large enough for the type, True =
    whenever the type has one, False = never (benchmarks and tests; by default the results are
    bit-identical either way, with fast=True they agree within rounding).
    fast: allow the kernels that are not batch invariant (cb_matmul_opts_t.fast; by default a
    token's row is bit-identical whatever the batch and the path).
    """
    cdef cb_matrix_t m
    cdef int type = type_id(t)
    keep = _raw_matrix(&m, type, raw, rows, cols)
    xa = np.asarray(x)
    if xa.dtype != np.float32:
        raise ValueError(f"x must be float32, got {xa.dtype}")
    single = xa.ndim == 1
    if single:
        xa = xa.reshape(1, -1)
    if xa.ndim != 2 or xa.shape[1] != cols:
        raise ValueError(f"x of shape {np.shape(x)} does not match a weight with {cols} columns")
    xa = np.ascontiguousarray(xa)
    cdef cb_matmul_opts_t opts = cb_matmul_default_opts()
    opts.accumulate = 1 if accumulate else 0
    opts.packed = 0 if packed is None else (1 if packed else -1)
    opts.fast = 1 if fast else 0
    n_tokens = xa.shape[0]
    if token_ids is not None:
        ids_np = np.asarray(token_ids)
        if ids_np.ndim != 1:
            raise ValueError("token_ids must be one-dimensional")
        if ids_np.size and (ids_np.min() < 0 or ids_np.max() >= xa.shape[0]):
            raise ValueError(f"token_ids out of range [0, {xa.shape[0]})")
        ids32 = np.ascontiguousarray(ids_np, dtype=np.int32)
        n_tokens = ids32.size
        if out is None:
            raise ValueError("token_ids needs out")
    if out is None:
        y = np.zeros((n_tokens, rows), dtype=np.float32) if accumulate else np.empty((n_tokens, rows), dtype=np.float32)
    else:
        y = out.reshape(1, -1) if (single and out.ndim == 1) else out
        if not isinstance(y, np.ndarray) or y.dtype != np.float32 or not y.flags.c_contiguous:
            raise ValueError("out must be a C-contiguous float32 array")
        if y.ndim != 2 or y.shape[1] != rows or (token_ids is None and y.shape[0] != n_tokens):
            raise ValueError(f"out of shape {out.shape} does not fit ({n_tokens}, {rows})")
        if token_ids is not None and y.shape[0] != xa.shape[0]:
            raise ValueError("with token_ids, out must have as many rows as x")
    if token_scale is not None:
        sc = np.ascontiguousarray(token_scale, dtype=np.float32).reshape(-1)
        if sc.size != n_tokens:
            raise ValueError(f"token_scale has {sc.size} values for {n_tokens} tokens")
    if n_tokens == 0 or rows == 0:
        return y[0] if single else y
    cdef const float[:, ::1] xv = xa
    cdef float[:, ::1] yv = y
    cdef const float[::1] scv
    cdef const int32_t[::1] idv
    if token_scale is not None:
        scv = sc
        opts.token_scale = &scv[0]
    if token_ids is not None:
        idv = ids32
        opts.token_ids = &idv[0]
        opts.n_rows_xy = xa.shape[0]
    if pool is None and threads > 1:
        pool = ThreadPool(threads)
    cdef cb_threadpool_t *pp = pool.pool if pool is not None else NULL
    cdef int64_t nt = n_tokens
    with nogil:
        s = cb_matmul_ex(&m, &xv[0, 0], nt, cols, &yv[0, 0], rows, &opts, pp)
    check(s)
    del keep
    return y[0] if single else y


ctypedef cb_status (*_quantize_fn)(const float *, int64_t, void *) noexcept nogil


cdef object _quantize(object x, str name, str unit, int64_t block, int64_t block_bytes,
                      _quantize_fn fn):
    xa = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if xa.size % block:
        raise ValueError(f"{name}: {xa.size} values is not a multiple of the {unit} {block}")
    out = np.empty(xa.size // block * block_bytes, dtype=np.uint8)
    if xa.size == 0:
        return out
    cdef const float[::1] xv = xa
    cdef uint8_t[::1] ov = out
    cdef int64_t n = xa.size
    cdef cb_status s
    with nogil:
        s = fn(&xv[0], n, &ov[0])
    check(s)
    return out


def r16_layout(t):
    """The name of type t's R16 layout ("Q8_0" -> "Q8_0_R16", "Q5_0" -> "Q5_0_R16", "Q6_K" ->
    "Q6_K_R16"), else None."""
    cdef int lay = cb_r16_layout(type_id(t))
    return type_name(lay) if lay else None


def pack_r16(t, raw, int64_t rows, int64_t cols, out=None, ThreadPool pool=None):
    """The Q8_0, Q5_0 or Q6_K weight `raw` (rows x cols) re-laid as its R16 layout (quant.h): a
    64-byte aligned uint8 array of r16_bytes(layout, rows, cols), or written into `out` (a
    writable, 64-byte aligned uint8 array of at least that many bytes, returned).
    matmul(layout, ...) and get_rows read it."""
    cdef cb_matrix_t m
    cdef int type = type_id(t)
    lay = r16_layout(type)
    if lay is None:
        raise ValueError(f"{type_name(type)} has no R16 layout (Q8_0, Q5_0, Q6_K and Q4_K do)")
    keep = _raw_matrix(&m, type, raw, rows, cols)
    need = r16_bytes(lay, rows, cols)
    if out is None:
        buf = np.empty(need + 64, dtype=np.uint8)
        skip = (-buf.ctypes.data) % 64
        out = buf[skip:skip + need]
    if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or out.ndim != 1 \
            or not out.flags.c_contiguous or not out.flags.writeable or out.size < need \
            or (need and out.ctypes.data % 64):
        raise ValueError(f"out must be a writable contiguous 1-D uint8 array of at least {need} "
                         "bytes, 64-byte aligned")
    if need == 0:
        return out
    cdef uint8_t[::1] dv = out
    cdef cb_threadpool_t *p = pool.pool if pool is not None else NULL
    cdef size_t nbytes = out.size
    with nogil:
        s = cb_pack_r16(&m, &dv[0], nbytes, p)
    check(s)
    del keep
    return out


def r16_bytes(layout, int64_t rows, int64_t cols):
    """Bytes of an R16 layout's matrix of rows x cols (cols a multiple of the block size)."""
    cdef int lay = type_id(layout)
    if type_name(lay) not in LAYOUTS:
        raise ValueError(f"{type_name(lay)} is not an R16 layout ({', '.join(LAYOUTS)})")
    row_bytes(lay, cols)  # cols: a multiple of the block size
    if rows < 0:
        raise ValueError(f"negative row count {rows}")
    n = cb_r16_bytes(lay, rows, cols)
    if n == 0 and rows > 0 and cols > 0:
        raise ValueError(f"no {type_name(lay)} layout for a {rows} x {cols} matrix")
    return n


def quantize_q8_0(x):
    """Quantize float32 values (size a multiple of 32) to Q8_0 blocks (uint8, 34 bytes each)."""
    return _quantize(x, "Q8_0", "block size", 32, 34, cb_quantize_q8_0)


def quantize_i4g128(x):
    """Quantize float32 values (size a multiple of 128) to I4_G128 blocks (uint8, 66 bytes
    each: f16 d = f16(max|x|/7), 64 bytes of nibbles, value 2i low / 2i+1 high nibble of byte i,
    q = clip(rint(x/d) + 8, 0, 15)). A [rows, cols] array gives rows * cols/128 * 66 bytes,
    row-major. ValueError on a non-finite value or an f16 scale overflow."""
    return _quantize(x, "I4_G128", "group size", 128, 66, cb_quantize_i4g128)
