"""Shared by tools/record_family_refs.py (which records llama.cpp's outputs) and
tests/model/test_family_llama_refs.py (which checks colibri against the recording without
llama.cpp): the families, the prompts, how each GGUF is built (so that both build the same
bytes), the file and tensor digests, the Q4_K_M rebuild and the comparison itself."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import oracle_models as om

from colibri.tools.refs import kl_top, log_softmax, matched, writer_like

REFS = Path(__file__).resolve().parent / "data" / "llama_refs" / "families.npz"

# the families of issue 48 (and the two extras), in recording order
FAMILIES = ["gemma2", "phi3", "phi3_longrope", "phimoe", "dots1", "glm4moe", "ernie4_5_moe",
            "granitemoe", "granitemoeshared", "hunyuan_v1_moe", "gemma4", "gemma4_ple"]
# issues 46 and 47's families, each recording apart (tools/record_family_refs.py --out PATH
# FAMILY...)
REFS_MLA = REFS.with_name("deepseek2.npz")
FAMILIES_MLA = ["deepseek_v3", "deepseek_v2"]
REFS_OSS = REFS.with_name("gpt_oss.npz")
FAMILIES_OSS = ["gpt_oss"]
REFS_L4 = REFS.with_name("llama4.npz")
FAMILIES_L4 = ["llama4_8k"]
REFS_Q3N = REFS.with_name("qwen3next.npz")
FAMILIES_Q3N = ["qwen3next"]
TYPES = ("f16", "q8_0", "q4_k_m")
PROMPTS = [om.prompt(48, seed=11), om.prompt(80, seed=12)]
TOP_K = 16
N_GREEDY = 16
Q4_K_M_FILE_TYPE = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


def key(family: str, outtype: str, what: str) -> str:
    return f"{family}__{outtype}__{what}"


@contextlib.contextmanager
def _dots1_without_gqa() -> Iterator[None]:
    """llama.cpp's dots1 makes K and V as wide as Q: build dots1 with as many KV heads as heads
    (as tools/dev/families_vs_llama.py does)."""
    base = om.family_configs

    def configs():
        cfgs, common = base()
        cls, model, extra = cfgs["dots1"]
        return {**cfgs, "dots1": (cls, model, dict(extra, num_key_value_heads=4))}, common

    om.family_configs = configs
    try:
        yield
    finally:
        om.family_configs = base


def build_ggufs(family: str, out: Path) -> dict[str, Path]:
    """The seeded tiny model of a family converted by colibri's converter to f16 and q8_0."""
    with _dots1_without_gqa():
        _, paths = om.build(family, out, ("f16", "q8_0"))
    return {t: Path(p) for t, p in paths.items()}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensor_digest(path: Path) -> str:
    """SHA-256 over every tensor's name, type, shape and bytes, in file order: equal for two
    files holding the same tensors whatever their metadata."""
    import gguf

    h = hashlib.sha256()
    for t in gguf.GGUFReader(path).tensors:
        shape = [int(x) for x in t.shape]
        while len(shape) > 1 and shape[-1] == 1:  # as ggml writes it (ggml_n_dims): llama.cpp's
            shape.pop()  # quantizer stores qwen3next's [64, 1] shared-expert gate as [64]
        h.update(f"{t.name}|{int(t.tensor_type)}|{tuple(shape)}|".encode())
        h.update(np.ascontiguousarray(t.data).view(np.uint8).tobytes())
    return h.hexdigest()


def tensor_types(path: Path) -> list[tuple[str, str]]:
    import gguf

    return [(t.name, t.tensor_type.name) for t in gguf.GGUFReader(path).tensors]


def write_q4_k_m(f16: Path, types: list[tuple[str, str]], dst: Path) -> Path:
    """Rebuild llama.cpp's Q4_K_M file from the f16 one without llama.cpp: each tensor
    quantized by the gguf package to the type llama-quantize gave it (recorded). gguf's
    quantizers are ports of ggml's reference ones, so the tensor bytes equal llama.cpp's (the
    caller checks tensor_digest against the recording); the metadata is the f16 file's with
    general.file_type set to Q4_K_M."""
    import gguf

    r, w = writer_like(f16, dst, skip=("general.file_type",))
    w.add_file_type(Q4_K_M_FILE_TYPE)
    src = {t.name: t for t in r.tensors}
    # llama-quantize writes the tensors in its own order (the recorded one)
    assert sorted(n for n, _ in types) == sorted(src), "the recorded tensors are not the f16 file's"
    for name, tname in types:
        t = src[name]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        qt = gguf.GGMLQuantizationType[tname]
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, x)
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(x, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def compare(path: Path, refs, family: str, outtype: str) -> dict:
    """colibri on one GGUF against the recording: teacher-forced top-1 agreement over every
    position of every prompt, mean and max KL, and each prompt's greedy tokens matched."""
    from colibri.model import Model

    agree = total = 0
    kls, greedy = [], []
    with Model(str(path), threads=2, ctx=256, verbose=False, tokenizer=False) as m:
        for i, ids in enumerate(PROMPTS):
            lp = log_softmax(m.logits(ids))
            top = refs[key(family, outtype, f"top_ids_{i}")]
            agree += int((lp.argmax(axis=1) == top[:, 0]).sum())
            total += len(ids)
            kls.append(kl_top(top, refs[key(family, outtype, f"top_logprobs_{i}")], lp))
            want = refs[key(family, outtype, f"greedy_{i}")].tolist()
            seq = m.new_sequence()
            logits = m.eval([seq], tokens=ids, logits=[False] * (len(ids) - 1) + [True])
            got: list[int] = []
            for _ in range(len(want)):
                got.append(int(np.argmax(logits[-1])))
                logits = m.eval([seq], tokens=[got[-1]])
            m.free_sequence(seq)
            greedy.append(matched(got, want))
    kl = np.concatenate(kls)
    return {"top1": agree / total, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "greedy": greedy}
