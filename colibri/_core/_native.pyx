"""The compiled core of colibri: the one extension module, linking the one copy of the C library
(colibri/_core/*.c). Process-wide state of the C library (the SIMD cap, the SIGBUS guard's
mapping table, the thread pool's nested-run guard, the thread-local error detail) therefore
exists once per process.

One .pxi per concept (per header of include/colibri/), included here in dependency order; the
cdef classes of one are typed arguments of another (Forward takes a KVCache, an ExpertStore and
a ThreadPool, never an address). colibri._core._arena, ._quant, ... are small Python modules
re-exporting each concept's public names from here."""

include "_check.pxi"
include "_status.pxi"
include "_mapguard.pxi"
include "_arena.pxi"
include "_quant.pxi"
include "_ops.pxi"
include "_tokenizer.pxi"
include "_desc.pxi"
include "_forward.pxi"
