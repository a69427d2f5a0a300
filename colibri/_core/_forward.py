"""The model description, the expert store and the forward pass (include/colibri/experts.h,
forward.h): the names that _desc.pxi and _forward.pxi define in colibri._core._native, the one
extension module."""

from colibri._core._native import (
    GATING_SIGMOID,
    GATING_SOFTMAX,
    GATING_SOFTMAX_WEIGHT,
    GATING_SPARSEMIXER,
    ROUTE_MAX_EXPERTS,
    ROUTE_MAX_K,
    ROUTE_WARP_MAX_EXPERTS,
    CLayerDesc,
    CModelDesc,
    ExpertStore,
    Forward,
    cb_experts_mode,
    cb_experts_policy,
    cb_kerr,
    cb_kfile,
    cb_qk_norm,
    desc_fields,
    desc_struct_size,
)

__all__ = [
    "CLayerDesc", "CModelDesc", "ExpertStore", "Forward", "GATING_SIGMOID", "GATING_SOFTMAX", "GATING_SOFTMAX_WEIGHT",
    "GATING_SPARSEMIXER",
    "ROUTE_MAX_EXPERTS", "ROUTE_MAX_K", "ROUTE_WARP_MAX_EXPERTS",
    "cb_experts_mode", "cb_experts_policy", "cb_kerr",
    "cb_kfile", "cb_qk_norm", "desc_fields", "desc_struct_size",
]
