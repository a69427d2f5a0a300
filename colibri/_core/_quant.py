"""GGUF block types, the CPU kernels and the thread pool (include/colibri/quant.h, threadpool.h):
the names that _quant.pxi defines in colibri._core._native, the one extension module."""

from colibri._core._native import (
    COLIBRI_TYPES,
    LAYOUTS,
    SUPPORTED,
    THREADPOOL_MAX_THREADS,
    TYPES,
    ThreadPool,
    block_bytes,
    block_size,
    cb_type,
    dequantize,
    get_rows,
    matmul,
    pack_r16,
    quantize_i4g128,
    quantize_q8_0,
    r16_bytes,
    r16_layout,
    row_bytes,
    supported,
    type_id,
    type_name,
)

__all__ = [
    "TYPES", "COLIBRI_TYPES", "SUPPORTED", "type_id", "type_name", "block_size", "block_bytes",
    "supported", "row_bytes", "ThreadPool", "dequantize", "get_rows", "matmul", "quantize_q8_0",
    "quantize_i4g128", "cb_type", "LAYOUTS", "pack_r16", "r16_bytes", "r16_layout",
    "THREADPOOL_MAX_THREADS",
]
