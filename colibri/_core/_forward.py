"""The expert store and the forward pass (include/colibri/experts.h, forward.h): the names that
_forward.pxi defines in colibri._core._native, the one extension module."""

from colibri._core._native import (
    GATING_SIGMOID,
    GATING_SOFTMAX,
    ROUTE_MAX_EXPERTS,
    ROUTE_MAX_K,
    ExpertStore,
    Forward,
    cb_experts_mode,
    cb_experts_policy,
    cb_qk_norm,
)

__all__ = [
    "ExpertStore", "Forward", "GATING_SIGMOID", "GATING_SOFTMAX", "ROUTE_MAX_EXPERTS",
    "ROUTE_MAX_K", "cb_experts_mode", "cb_experts_policy", "cb_qk_norm",
]
