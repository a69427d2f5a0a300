"""The colibri container: a GGUF model re-laid out so that one read fetches one expert.

    convert("model.gguf", "model.colibri", quant="keep")     # the writer (tools/convert_gguf.py,
    cf = ContainerFile("model.colibri")                        #  `colibri convert`)
    f = open_model_file(path)                                  # a GGUFFile or a ContainerFile

Layout (docs/ARCHITECTURE.md, "The colibri container", is the full specification):

    [0, 64)           preamble: "COLI", u32 version, u64 header_bytes, u64 file_size,
                      u32 header_crc32, u32 flags, 32 zero bytes
    [64, 64+header)   header: the GGUF metadata key/values (GGUF v3 encoding, types kept), the
                      tensor directory, the expert groups with one crc32 per expert, the dense
                      region and its crc32
    dense region      every non-expert tensor, 64-byte aligned, starting 4096-aligned
    expert region     per MoE layer (layer-major), per expert (expert-minor): gate, up, down
                      ADJACENT (no padding), each expert at base + e * stride with base and
                      stride multiples of 2 MiB; the padding is a hole (seek), not written

The expert store's per-layer descriptor (experts.h) describes this with gate_stride = up_stride
= down_stride = stride and gate/up/down offsets base, base + G, base + G + U.

`ContainerFile` validates as strictly as `colibri.gguf.GGUFFile` (every failure a
`ContainerError`, a ValueError naming the file and the region or tensor) and offers the same
interface (`metadata`, `metadata_types`, `tensors`, `data()`, `architecture`, `close()`, ...)
so that colibri.arch, the tokenizer and colibri.model read either. An expert tensor's `data()`
is a strided (n_expert, bytes per expert) view; `expert_span()` gives the contiguous base view
and the stride the expert store needs.
"""

from __future__ import annotations

from colibri.container.format import (
    CONTAINER_MAGIC,
    CONTAINER_VERSION,
    EXPERT_ALIGN,
    QUANTS,
    ContainerError,
    ExpertGroup,
    ExpertPart,
)
from colibri.container.reader import ContainerFile, is_container, open_model_file
from colibri.container.writer import clean_stale_temporaries, convert

__all__ = [
    "CONTAINER_MAGIC",
    "CONTAINER_VERSION",
    "EXPERT_ALIGN",
    "QUANTS",
    "ContainerError",
    "ContainerFile",
    "ExpertGroup",
    "ExpertPart",
    "clean_stale_temporaries",
    "convert",
    "is_container",
    "open_model_file",
]
