"""The float ops (include/colibri/ops.h) over numpy float32 arrays: the names that _ops.pxi defines
in colibri._core._native, the one extension module."""

from colibri._core._native import (
    ROPE_MAX_DIMS,
    add,
    axpy,
    cb_act,
    cb_rope_mode,
    dot,
    dot_rows,
    gelu_tanh,
    glu,
    mul,
    rmsnorm,
    rope,
    rope_cache,
    rope_yarn_corr_dims,
    scale,
    silu,
    softcap,
    softmax,
)

__all__ = [
    "ROPE_MAX_DIMS", "rmsnorm", "rope", "rope_cache", "rope_yarn_corr_dims", "softmax", "silu",
    "gelu_tanh", "glu", "mul", "add", "axpy", "scale", "softcap", "dot", "dot_rows", "cb_act",
    "cb_rope_mode",
]
