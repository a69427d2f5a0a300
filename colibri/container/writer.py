"""The colibri container's writer: convert() re-lays a GGUF file out as a container (optionally
requantizing the routed experts), through a temporary file published atomically."""

from __future__ import annotations

import os
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from colibri._tempfiles import chmod_as_new_file, tmp_prefix
from colibri._tempfiles import clean_stale_temporaries as _clean_stale_temporaries
from colibri._tempfiles import stale_temporaries as _stale_temporaries
from colibri.container.format import (
    _EXPERT_RE,
    _PART_ORDER,
    DENSE_ALIGN,
    DENSE_START_ALIGN,
    EXPERT_ALIGN,
    I4_G128,
    NO_GROUP,
    PREAMBLE,
    QUANTS,
    ContainerError,
    ExpertGroup,
    ExpertPart,
    _align,
    _enc_header,
    _enc_kv,
    _Entry,
    _log,
    _preamble,
    _sizes,
)
from colibri.container.reader import ContainerFile, is_container
from colibri.gguf import (
    GGUFFile,
    TensorInfo,
)
from colibri.inputs import regular_file
from colibri.output_file import check_output, publish


def _quantizer(quant: str) -> tuple[int, Callable[[np.ndarray], np.ndarray]]:
    """(target type, f32 [rows, cols] -> uint8 [rows, row_bytes])."""
    if quant in ("q8_0", "q4_0"):
        from gguf import quants

        qt = GGMLQuantizationType.Q8_0 if quant == "q8_0" else GGMLQuantizationType.Q4_0
        return int(qt), lambda w: np.asarray(quants.quantize(w, qt), dtype=np.uint8)
    if quant == "int4-g128":
        import colibri.quant as cq

        fn = getattr(cq, "quantize_i4g128", None) or getattr(cq, "quantize_i4_g128", None)
        if fn is None:
            raise ContainerError("int4-g128 needs colibri.quant's I4_G128 quantizer, which this "
                                 "build does not have")

        def q(w: np.ndarray) -> np.ndarray:
            rows, cols = w.shape
            out = np.asarray(fn(np.ascontiguousarray(w, dtype=np.float32).reshape(-1)), dtype=np.uint8)
            return out.reshape(rows, cols // 128 * 66)

        return I4_G128, q
    raise ContainerError(f"unknown quant {quant!r}: expected one of {', '.join(QUANTS)}")


def _dequant(raw: np.ndarray, ttype: int, rows: int, cols: int) -> np.ndarray:
    from gguf import quants

    if ttype == int(GGMLQuantizationType.F32):
        return raw.view(np.float32).reshape(rows, cols)
    return np.asarray(quants.dequantize(raw.reshape(rows, -1), GGMLQuantizationType(ttype)),
                      dtype=np.float32).reshape(rows, cols)


@dataclass
class _Plan:
    entries: list[_Entry]
    groups: list[ExpertGroup]
    src_types: dict[str, int]
    file_size: int
    header_bytes: int
    dense: tuple[int, int]


def _expert_tensors(gf: GGUFFile) -> dict[int, list[TensorInfo]]:
    """The stacked expert tensors (blk.N.ffn_*_exps.weight, 3-D) of each layer, in the order
    gate, gate_up, up, down, then any other by name."""
    layers: dict[int, list[tuple[int, str, TensorInfo]]] = {}
    for t in gf.tensors.values():
        m = _EXPERT_RE.match(t.name)
        if m and len(t.shape) == 3:
            layers.setdefault(int(m.group(1)), []).append((_PART_ORDER.get(m.group(2), 9), t.name, t))
    return {layer: [t for _, _, t in sorted(v, key=lambda x: x[:2])] for layer, v in layers.items()}


def _plan(gf: GGUFFile, kv: bytes, n_kv: int, quant: str) -> _Plan:
    layers = _expert_tensors(gf)
    expert_names = {t.name for parts in layers.values() for t in parts}
    target = _quantizer(quant)[0] if quant != "keep" else None
    block_t = _sizes(target) if target is not None else (1, 1)
    entries: list[_Entry] = []
    src_types: dict[str, int] = {}
    for t in gf.tensors.values():
        ttype, nbytes = t.type, t.nbytes
        if t.name in expert_names and target is not None and t.type != target:
            if t.shape[0] % block_t[0]:
                raise ContainerError(
                    f"{gf.path}: tensor {t.name!r} has rows of {t.shape[0]} values, not a "
                    f"multiple of {block_t[0]}: it cannot be quantized to {quant}")
            ttype, nbytes = target, t.n_elements // block_t[0] * block_t[1]
        src_types[t.name] = t.type
        entries.append(_Entry(t.name, t.shape, ttype, 0, nbytes, NO_GROUP))
    index = {e.name: i for i, e in enumerate(entries)}
    by_name = {e.name: e for e in entries}
    # sizes first (offsets do not change the header's length: every field is fixed width)
    groups: list[ExpertGroup] = []
    for layer in sorted(layers):
        parts = layers[layer]
        n_exp = parts[0].shape[2]
        if any(p.shape[2] != n_exp for p in parts):
            raise ContainerError(f"{gf.path}: layer {layer}'s expert tensors disagree on the "
                                 f"number of experts: {[list(p.shape) for p in parts]}")
        rel = 0
        eparts = []
        for p in parts:
            pb = by_name[p.name].nbytes // n_exp
            eparts.append(ExpertPart(p.name, rel, pb))
            rel += pb
        groups.append(ExpertGroup(layer, n_exp, 0, _align(rel, EXPERT_ALIGN), rel, tuple(eparts),
                                  (0,) * n_exp))
    header = _enc_header(kv, n_kv, entries, groups, index, (0, 0, 0))
    pos = dense_start = _align(PREAMBLE + len(header), DENSE_START_ALIGN)
    for e in entries:
        if e.name not in expert_names:
            e.offset = _align(pos, DENSE_ALIGN)
            pos = e.offset + e.nbytes
    dense_end = pos
    pos = _align(pos, EXPERT_ALIGN)
    placed: list[ExpertGroup] = []
    end = pos
    for g0 in groups:
        g = ExpertGroup(g0.layer, g0.n_expert, pos, g0.stride, g0.used, g0.parts, g0.crcs)
        for part in g.parts:
            ent = by_name[part.name]
            ent.offset, ent.group = pos + part.rel, len(placed)
        placed.append(g)
        end = pos + (g.n_expert - 1) * g.stride + g.used
        pos = _align(end, EXPERT_ALIGN)
    file_size = end if placed else dense_end
    return _Plan(entries, placed, src_types, file_size, len(header), (dense_start, dense_end))


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str], quant: str = "keep",
            progress: bool | Callable[[str], None] = True, verify: bool = True,
            check_model: bool = True, force: bool = False,
            _fail_after: int | None = None) -> dict[str, Any]:
    """Write the container of GGUF file src to dst (atomically: a temporary file in dst's
    directory, fsync, rename; on any error or interrupt no file is left under either name).

    The output (see _check_output): a new name; an existing regular file or symbolic link only
    with force=True (a link is replaced by the container, its target is never written); never
    anything else (a device such as /dev/null, a FIFO, a socket, a directory), force or not.
    Without force the container is published with link(2), which fails when any file appeared
    under the name meanwhile (a concurrent converter, say), so nothing is ever overwritten.
    Stale temporaries of earlier runs for the same output whose writer process is dead (killed
    with SIGKILL, a power cut) are removed first, each named with its size on stderr (or to the
    progress callable); a live converter's temporary is never touched.

    quant: "keep" (every tensor keeps its block type), or "q8_0" / "q4_0" / "int4-g128": the
    routed expert tensors are requantized (from their dequantized values; a tensor already of
    the target type is copied as is), dense tensors are kept. progress: True logs a line per
    layer (logger "colibri", INFO), a callable receives the lines, False is quiet. verify: re-open the written
    file and check every checksum before the rename. check_model: refuse a GGUF colibri cannot
    run (colibri.arch.describe: architecture, keys, tensor shapes), naming what is wrong.
    Returns a summary dict (sizes, seconds, removed_temporaries: [(path, bytes)]).
    _fail_after (tests): raise after that many experts were written."""
    if quant not in QUANTS:
        raise ContainerError(f"unknown quant {quant!r}: expected one of {', '.join(QUANTS)}")
    src, dst = os.fspath(src), os.fspath(dst)
    say: Callable[[str], None]
    if callable(progress):
        say = progress
    elif progress:
        def say(msg: str) -> None:
            _log.info("convert: %s", msg)
    else:
        def say(msg: str) -> None:
            pass
    regular_file(src, "input file")  # a FIFO or a device: refused, never opened (it would block)
    if is_container(src):
        raise ContainerError(f"{src} is already a colibri container")
    if not os.path.isdir(os.path.dirname(os.path.abspath(dst))):
        raise FileNotFoundError(f"output directory {os.path.dirname(os.path.abspath(dst))} "
                                "does not exist")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ContainerError(f"output {dst} is the input file")
    if os.path.realpath(src) == os.path.realpath(dst):
        raise ContainerError(f"output {dst} is the input file")
    _check_output(dst, force)
    t0 = time.perf_counter()
    gf = GGUFFile(src)
    try:
        if check_model:
            from colibri.arch import describe

            describe(gf)  # UnsupportedModel (a ValueError) naming the key or tensor
        removed = clean_stale_temporaries(dst, say if callable(progress) else _warn)
        summary = _write(gf, src, dst, quant, say, verify, _fail_after, t0, force)
        summary["removed_temporaries"] = removed
        return summary
    finally:
        gf.close()


def _warn(msg: str) -> None:
    _log.warning("convert: %s", msg)


def _tmp_prefix(dst: str) -> str:
    """This process's temporaries for dst (colibri._tempfiles.tmp_prefix: the writer's pid in
    the name, so that a later run can tell a dead writer's leftover from a live one's)."""
    return tmp_prefix(dst)


def stale_temporaries(dst: str | os.PathLike[str]) -> list[tuple[str, int, int]]:
    """colibri's temporaries for output dst in its directory: [(path, writer pid, bytes)],
    regular files only (never followed through a link)."""
    return _stale_temporaries(dst)


def clean_stale_temporaries(dst: str | os.PathLike[str],
                            say: Callable[[str], None] = _warn) -> list[tuple[str, int]]:
    """Remove colibri's temporaries for output dst whose writer process no longer exists
    (a converter killed with SIGKILL cannot remove its own). A temporary of a live process -
    a concurrent converter of the same output - is kept. Each removal is reported through say
    with its size on disk; returns [(path, bytes)]. (colibri._tempfiles, shared with the
    model cache and the default model's assembly.)"""
    return _clean_stale_temporaries(dst, say, writer="converter")


def _check_output(dst: str, force: bool) -> None:
    """The output rules of every colibri writer (colibri.output_file.check_output), raising
    ContainerError."""
    check_output(dst, force, ContainerError)


def _publish(tmp: str, dst: str, force: bool) -> None:
    """Move the finished temporary to dst (colibri.output_file.publish): never over a file that
    appeared meanwhile without force."""
    publish(tmp, dst, force, ContainerError, "converting")


def _write(gf: GGUFFile, src: str, dst: str, quant: str, say: Callable[[str], None],
           verify: bool, fail_after: int | None, t0: float, force: bool) -> dict[str, Any]:
    if gf.architecture is None:
        raise ContainerError(f"{src}: no general.architecture key: not a model file")
    kv = b"".join(_enc_kv(k, gf.metadata[k], gf.metadata_types[k]) for k in gf.metadata)
    plan = _plan(gf, kv, len(gf.metadata), quant)
    quantize = _quantizer(quant)[1] if quant != "keep" else None
    index = {e.name: i for i, e in enumerate(plan.entries)}
    by_name = {e.name: e for e in plan.entries}
    dense_start, dense_end = plan.dense
    n_experts = sum(g.n_expert for g in plan.groups)
    say(f"{os.path.basename(src)} -> {os.path.basename(dst)}: {len(plan.entries)} tensors, "
        f"{len(plan.groups)} MoE layers, {n_experts} experts, quant {quant}")
    dirname = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(dst), suffix=".tmp", dir=dirname)
    try:
        chmod_as_new_file(fd)  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(PREAMBLE + plan.header_bytes))
            # dense region (padding written as zeros: it is small and inside the checksum)
            f.seek(dense_start)
            pos, crc = dense_start, 0
            for e in plan.entries:
                if e.group != NO_GROUP:
                    continue
                pad = bytes(e.offset - pos)
                f.write(pad)
                crc = zlib.crc32(pad, crc)
                data = gf.data(e.name)
                f.write(data.data)
                crc = zlib.crc32(data.data, crc)
                pos = e.offset + e.nbytes
            assert pos == dense_end
            say(f"dense: {(dense_end - dense_start) / 2**20:.1f} MiB")
            dense = (dense_start, dense_end, crc)
            groups = []
            written = 0
            for gi, g in enumerate(plan.groups):
                crcs = []
                srcs = []
                for p in g.parts:
                    t = gf.tensors[p.name]
                    srcs.append((t, gf.data(p.name), t.nbytes // g.n_expert))
                # an expert's parts go out in one write from its 2 MiB-aligned start: the page
                # cache then holds them in 2 MiB folios, which the mapped store's MADV_HUGEPAGE
                # mapping reads through one TLB entry each (part by part, ~1 MiB writes left
                # small folios: 4 KiB entries until the file was next read from disk)
                buf = bytearray(g.used)
                for x in range(g.n_expert):
                    c = 0
                    for (t, raw, sb), p in zip(srcs, g.parts, strict=True):
                        piece = raw[x * sb:(x + 1) * sb]
                        if quantize is not None and by_name[p.name].type != t.type:
                            cols, rows = t.shape[0], t.shape[1]
                            piece = quantize(_dequant(piece, t.type, rows, cols)).reshape(-1)
                        assert piece.nbytes == p.nbytes
                        buf[p.rel:p.rel + p.nbytes] = piece.data.cast("B")
                        c = zlib.crc32(piece.data, c)
                    f.seek(g.base + x * g.stride)
                    f.write(buf)
                    crcs.append(c)
                    written += 1
                    if fail_after is not None and written >= fail_after:
                        raise RuntimeError(f"simulated failure after {written} experts")
                groups.append(ExpertGroup(g.layer, g.n_expert, g.base, g.stride, g.used, g.parts,
                                          tuple(crcs)))
                say(f"layer {g.layer}: {g.n_expert} experts of {g.used / 2**20:.2f} MiB "
                    f"({gi + 1}/{len(plan.groups)} MoE layers, "
                    f"{100 * (gi + 1) / len(plan.groups):.0f}%)")
            f.truncate(plan.file_size)
            header = _enc_header(kv, len(gf.metadata), plan.entries, groups, index, dense)
            assert len(header) == plan.header_bytes
            f.seek(0)
            f.write(_preamble(len(header), plan.file_size, header))
            f.write(header)
            f.flush()
            os.fsync(f.fileno())
        verify_s = 0.0
        if verify:
            t1 = time.perf_counter()
            with ContainerFile(tmp, verify=True) as cf:
                if set(cf.tensors) != set(gf.tensors):
                    raise ContainerError(f"{tmp}: the written directory differs from the input")
            verify_s = time.perf_counter() - t1
            say(f"verified every checksum in {verify_s:.2f} s")
        _publish(tmp, dst, force)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(dirname, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    st = os.stat(dst)
    summary: dict[str, Any] = {"path": dst, "file_size": plan.file_size, "disk_bytes": st.st_blocks * 512,
               "dense_bytes": dense_end - dense_start,
               "expert_bytes": sum(g.used * g.n_expert for g in plan.groups),
               "n_experts": n_experts, "seconds": time.perf_counter() - t0, "verify_s": verify_s}
    say(f"wrote {dst}: {plan.file_size / 2**20:.1f} MiB ({summary['disk_bytes'] / 2**20:.1f} MiB "
        f"on disk) in {summary['seconds']:.1f} s")
    return summary
