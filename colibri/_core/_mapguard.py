"""The SIGBUS guard of mapped model files (include/colibri/mapguard.h): the names that _mapguard.pxi
defines in colibri._core._native, the one extension module."""

from colibri._core._native import (
    MAX_MAPPINGS,
    count,
    install,
    message,
    register,
    unregister,
)

__all__ = [
    "MAX_MAPPINGS", "install", "register", "unregister", "count", "message",
]
