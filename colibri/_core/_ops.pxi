"""Python wrappers of the float ops (include/colibri/ops.h) over numpy float32 arrays, for tests
and tools. Inputs are converted to float32 (a copy when needed) and never modified: every
function returns a new array. Shapes are checked here, before any pointer reaches C; the GIL is
released around each C call."""

from libc.stdint cimport int64_t, uintptr_t

from colibri._core.ops cimport *

import numpy as np

_MODES = {"normal": CB_ROPE_NORMAL, "neox": CB_ROPE_NEOX}
_ACTS = {"silu": CB_ACT_SILU, "gelu_tanh": CB_ACT_GELU_TANH}
ROPE_MAX_DIMS = CB_ROPE_MAX_DIMS


cdef inline float *_fp(a):
    return <float *><uintptr_t>a.__array_interface__["data"][0]


cdef inline int64_t *_ip(a):
    return <int64_t *><uintptr_t>a.__array_interface__["data"][0]


def _f32(x, name="x"):
    a = np.array(x, dtype=np.float32, order="C", copy=True)
    return a


def _rows_view(x):
    """(array, n_rows, n, row_stride) for a float32 array whose last axis is unit-strided; a
    2-D array keeps its row stride (so strided rows reach C), anything else is made contiguous."""
    a = np.asarray(x)
    if a.ndim == 0:
        raise ValueError("expected an array with at least one dimension")
    if not (a.dtype == np.float32 and a.ndim == 2 and a.strides[1] == 4 and a.strides[0] % 4 == 0
            and a.strides[0] >= 4 * a.shape[1]):
        a = np.ascontiguousarray(a, dtype=np.float32)
        n = a.shape[-1]
        rows = a.size // n if n else 0
        return a, rows, n, n
    return a, a.shape[0], a.shape[1], a.strides[0] // 4


def rmsnorm(x, weight=None, float eps=1e-6, bint add_unit_offset=False):
    """x / sqrt(mean(x^2) + eps) * w over the last axis; w = weight (+1 with add_unit_offset),
    or 1 when weight is None. A 2-D x with strided rows is passed to C with its stride."""
    a, rows, n, stride = _rows_view(x)
    w = None
    if weight is not None:
        w = np.ascontiguousarray(weight, dtype=np.float32)
        if w.shape != (n,):
            raise ValueError(f"weight has shape {w.shape}, expected ({n},)")
    out = np.empty(np.shape(x), dtype=np.float32)
    if rows == 0 or n == 0:
        return out
    cdef const float *xp = _fp(a)
    cdef const float *wp = _fp(w) if w is not None else NULL
    cdef float *op = _fp(out)
    cdef int64_t r = rows, nn = n, xs = stride
    cdef int unit = add_unit_offset
    cdef cb_status s
    with nogil:
        s = cb_rmsnorm_rows(xp, xs, r, nn, wp, eps, unit, op, nn)
    check(s)
    return out


cdef cb_rope_params_t _rope_params(int64_t n_dims, mode, double freq_base, double freq_scale,
                                   double ext_factor, double attn_factor, double beta_fast,
                                   double beta_slow, int64_t n_ctx_orig) except *:
    if mode not in _MODES:
        raise ValueError(f"unknown rope mode {mode!r}; expected 'normal' or 'neox'")
    cdef cb_rope_params_t p = cb_rope_default_params()
    p.n_dims = n_dims
    p.mode = _MODES[mode]
    p.freq_base = freq_base
    p.freq_scale = freq_scale
    p.ext_factor = ext_factor
    p.attn_factor = attn_factor
    p.beta_fast = beta_fast
    p.beta_slow = beta_slow
    p.n_ctx_orig = n_ctx_orig
    return p


def _freq_factors(freq_factors, int64_t n_dims, int64_t head_dim):
    if freq_factors is None:
        return None
    nd = n_dims if n_dims else head_dim
    ff = np.ascontiguousarray(freq_factors, dtype=np.float32)
    if ff.shape != (nd // 2,):
        raise ValueError(f"freq_factors has shape {ff.shape}, expected ({nd // 2},)")
    return ff


def rope(x, positions, *, mode="normal", int64_t n_dims=0, double freq_base=10000.0,
         double freq_scale=1.0, double ext_factor=0.0, double attn_factor=1.0,
         double beta_fast=32.0, double beta_slow=1.0, int64_t n_ctx_orig=0, freq_factors=None):
    """RoPE on x of shape (n_tokens, n_heads, head_dim) at positions (n_tokens,) ints;
    parameters as cb_rope_params_t (n_dims 0 = head_dim). Returns the rotated copy."""
    a = _f32(x)
    if a.ndim != 3:
        raise ValueError(f"x has shape {a.shape}, expected (n_tokens, n_heads, head_dim)")
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    if pos.shape != (a.shape[0],):
        raise ValueError(f"positions has shape {pos.shape}, expected ({a.shape[0]},)")
    cdef cb_rope_params_t p = _rope_params(n_dims, mode, freq_base, freq_scale, ext_factor,
                                           attn_factor, beta_fast, beta_slow, n_ctx_orig)
    ff = _freq_factors(freq_factors, n_dims, a.shape[2])
    if ff is not None:
        p.freq_factors = _fp(ff)
    if a.size == 0:
        return a
    cdef float *xp = _fp(a)
    cdef const int64_t *pp = _ip(pos)
    cdef int64_t nt = a.shape[0], nh = a.shape[1], hd = a.shape[2]
    cdef cb_status s
    with nogil:
        s = cb_rope_batch(xp, nt, nh * hd, nh, hd, pp, &p)
    check(s)
    return a


def rope_cache(int64_t pos, int64_t head_dim, *, mode="normal", int64_t n_dims=0,
               double freq_base=10000.0, double freq_scale=1.0, double ext_factor=0.0,
               double attn_factor=1.0, double beta_fast=32.0, double beta_slow=1.0,
               int64_t n_ctx_orig=0, freq_factors=None):
    """(cos, sin) of every rotated pair at pos, each (n_dims/2,) float32."""
    cdef cb_rope_params_t p = _rope_params(n_dims, mode, freq_base, freq_scale, ext_factor,
                                           attn_factor, beta_fast, beta_slow, n_ctx_orig)
    ff = _freq_factors(freq_factors, n_dims, head_dim)
    if ff is not None:
        p.freq_factors = _fp(ff)
    nd = n_dims if n_dims else head_dim
    if not (0 < nd <= CB_ROPE_MAX_DIMS):
        raise ValueError(f"n_dims {nd} out of range (1..{CB_ROPE_MAX_DIMS})")
    c = np.empty(nd // 2, dtype=np.float32)
    sn = np.empty(nd // 2, dtype=np.float32)
    cdef float *cp = _fp(c)
    cdef float *sp = _fp(sn)
    cdef cb_status s
    with nogil:
        s = cb_rope_cache(pos, head_dim, &p, cp, sp)
    check(s)
    return c, sn


def rope_yarn_corr_dims(int64_t n_dims, int64_t n_ctx_orig, float freq_base,
                        float beta_fast=32.0, float beta_slow=1.0):
    """YaRN correction dims (low, high), as ggml_rope_yarn_corr_dims."""
    cdef float d[2]
    cb_rope_yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, d)
    return (d[0], d[1])


def softmax(x):
    """Stable softmax over the last axis (masked -inf entries get 0; an all -inf row all 0)."""
    a = _f32(x)
    if a.ndim == 0:
        raise ValueError("expected an array with at least one dimension")
    n = a.shape[-1]
    if a.size == 0:
        return a
    cdef float *xp = _fp(a)
    cdef int64_t rows = a.size // n, nn = n, r
    cdef cb_status s = CB_OK
    with nogil:
        for r in range(rows):
            s = cb_softmax(xp + r * nn, nn)
            if s != CB_OK:
                break
    check(s)
    return a


def _unary(x, cb_act act):
    a = _f32(x)
    out = np.empty_like(a)
    if a.size == 0:
        return out
    cdef const float *xp = _fp(a)
    cdef float *op = _fp(out)
    cdef int64_t n = a.size
    cdef cb_status s
    with nogil:
        s = cb_act_apply(act, xp, n, op)
    check(s)
    return out


def silu(x):
    """x * sigmoid(x), elementwise."""
    return _unary(x, CB_ACT_SILU)


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise (gelu_pytorch_tanh)."""
    return _unary(x, CB_ACT_GELU_TANH)


def _pair(a, b):
    a = _f32(a, "a")
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    return a, b


def glu(gate, up, act="silu"):
    """act(gate) * up elementwise; act 'silu' (SwiGLU) or 'gelu_tanh' (GeGLU)."""
    if act not in _ACTS:
        raise ValueError(f"unknown activation {act!r}; expected 'silu' or 'gelu_tanh'")
    g, u = _pair(gate, up)
    out = np.empty_like(g)
    if g.size == 0:
        return out
    cdef const float *gp = _fp(g)
    cdef const float *upp = _fp(u)
    cdef float *op = _fp(out)
    cdef int64_t n = g.size
    cdef cb_act a = _ACTS[act]
    cdef cb_status s
    with nogil:
        s = cb_glu(a, gp, upp, n, op)
    check(s)
    return out


def _binop(a, b, int which):
    x, y = _pair(a, b)
    out = np.empty_like(x)
    if x.size == 0:
        return out
    cdef const float *xp = _fp(x)
    cdef const float *yp = _fp(y)
    cdef float *op = _fp(out)
    cdef int64_t n = x.size
    cdef cb_status s
    with nogil:
        if which == 0:
            s = cb_mul(xp, yp, n, op)
        else:
            s = cb_add(xp, yp, n, op)
    check(s)
    return out


def mul(a, b):
    """a * b elementwise."""
    return _binop(a, b, 0)


def add(a, b):
    """a + b elementwise."""
    return _binop(a, b, 1)


def axpy(float alpha, x, y):
    """y + alpha * x (a new array)."""
    xv, yv = _pair(x, y)
    yv = _f32(yv)
    if xv.size == 0:
        return yv
    cdef const float *xp = _fp(xv)
    cdef float *yp = _fp(yv)
    cdef int64_t n = xv.size
    cdef cb_status s
    with nogil:
        s = cb_axpy(alpha, xp, n, yp)
    check(s)
    return yv


def scale(x, float s):
    """x * s (a new array)."""
    a = _f32(x)
    if a.size == 0:
        return a
    cdef float *xp = _fp(a)
    cdef int64_t n = a.size
    cdef cb_status st
    with nogil:
        st = cb_scale(xp, n, s)
    check(st)
    return a


def softcap(x, float cap):
    """cap * tanh(x / cap), elementwise (a new array); cap > 0."""
    a = _f32(x)
    cdef float *xp = _fp(a)
    cdef int64_t n = a.size
    cdef cb_status st
    with nogil:
        st = cb_softcap(xp if n else NULL, n, cap)
    check(st)
    return a


def dot(a, b):
    """sum(a * b) of two 1-D float32 vectors, accumulated in float."""
    x, y = _pair(a, b)
    if x.ndim != 1:
        raise ValueError(f"expected 1-D vectors, got shape {x.shape}")
    cdef float r = 0
    cdef const float *xp = _fp(x) if x.size else NULL
    cdef const float *yp = _fp(y) if x.size else NULL
    cdef int64_t n = x.size
    cdef cb_status s
    with nogil:
        s = cb_dot_f32(xp, yp, n, &r)
    check(s)
    return float(r)


def dot_rows(q, k, float scale=1.0):
    """scale * (k @ q): q (n,), k (n_rows, n) (strided rows kept) -> (n_rows,) float32."""
    qv = np.ascontiguousarray(q, dtype=np.float32)
    kv, rows, n, stride = _rows_view(k)
    if np.ndim(k) != 2 or qv.shape != (n,):
        raise ValueError(f"q {qv.shape} and k {np.shape(k)}: expected (n,) and (n_rows, n)")
    out = np.empty(rows, dtype=np.float32)
    if rows == 0:
        return out
    cdef const float *qp = _fp(qv) if n else NULL
    cdef const float *kp = _fp(kv) if n else NULL
    cdef float *op = _fp(out)
    cdef int64_t r = rows, nn = n, ks = stride
    cdef cb_status s
    with nogil:
        s = cb_dot_rows_f32(qp, kp, r, ks, nn, scale, op)
    check(s)
    return out
