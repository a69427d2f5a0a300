"""The SIGBUS guard of mapped model files (include/colibri/mapguard.h): a clear message naming
the file when it is truncated or rewritten in place while mapped. colibri.gguf registers every
mapping it makes; the handler and the table exist once per process."""

from libc.stdint cimport uintptr_t

from colibri._core.mapguard cimport *

MAX_MAPPINGS = CB_MAPGUARD_MAX


def install():
    """Install the process-wide SIGBUS handler (idempotent)."""
    check(cb_mapguard_install())


def register(uintptr_t address, size_t length, str path):
    """Register [address, address + length) as the mapping of file path; returns its id."""
    cdef int out = -1
    b = path.encode("utf-8", "surrogateescape")
    cdef const char *p = b
    check(cb_mapguard_register(<const void *>address, length, p, &out))
    return out


def unregister(int id):
    cb_mapguard_unregister(id)


def count():
    return cb_mapguard_count()


def message(uintptr_t address):
    """The line the handler would write for a fault at address ('' outside every mapping)."""
    cdef char buf[1024]
    cdef size_t n = cb_mapguard_message(<const void *>address, buf, sizeof(buf))
    return buf[:n].decode("utf-8", "replace")
