#!/usr/bin/env python3
"""A small MoE with *learned* routing, and how well the expert store can predict it:

    python tools/bench/learned_moe.py [--out DIR] [--steps 600] [--layers 4] [--experts 32]
                                      [--top-k 4] [--eval-tokens 256] [--threads 2]
                                      [--corpus-bytes 4194304]

The bench model of tools/make_bench_model.py has random routers (its routing is synthetic), so
what the next-layer prediction and the usage record achieve on it says little about a trained
MoE. This script trains a qwen3_moe-shaped model (transformers, random init, byte-level
vocabulary of 256 + 3 specials) for --steps CPU steps on text found on every machine (the
docstrings of Python's standard library, held-out part for evaluation), exports it with
colibri.tools.convert_hf, and runs colibri on the held-out bytes with the expert store in cache mode
at a budget of half the experts and prefetch on, reporting per layer:

- the next-layer prediction's precision and recall (the forward's hint for layer l+1, made from
  layer l's expert input with layer l+1's router, scored at layer l+1's acquire);
- routing skew: the share of routings taken by the most used quarter and half of the experts;
- the hit share the usage record predicts for that budget (colibri.usage.hit_share, the record
  made on the training text) against the cache's measured hit rate on the held-out text.

Figures depend on the training budget (loss printed); a few hundred steps already give a
router that is far from uniform. Like every tool here it imports the installed colibri (from a
checkout: PYTHONPATH=.).
"""

from __future__ import annotations

import argparse
import inspect
import os
import pydoc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BOS, EOS, PAD = 256, 257, 258


def corpus(max_bytes: int = 4 << 20) -> bytes:
    """Docstrings of the standard library's modules, classes and functions (plain English and
    code, the same on every Python install of a version)."""
    import pkgutil

    parts: list[str] = []
    size = 0
    stdlib = os.path.dirname(os.__file__)  # the folder itself: not site-packages below it
    skip = ("_", "test", "idle", "tkinter", "turtle", "antigravity", "this")
    names = sorted(m.name for m in pkgutil.iter_modules([stdlib])
                   if not m.name.startswith(skip))
    for mod in names:
        try:
            obj = __import__(mod)
        except BaseException:  # noqa: BLE001 - some modules refuse to import here
            continue
        for _, member in [(mod, obj)] + inspect.getmembers(obj):
            doc = inspect.getdoc(member) if inspect.ismodule(member) or inspect.isclass(member) \
                or inspect.isfunction(member) else None
            if doc:
                parts.append(pydoc.plain(doc))
                size += len(doc)
        if size > max_bytes:
            break
    return "\n\n".join(parts).encode("utf-8", "replace")[:max_bytes]


def train(out: Path, steps: int, layers: int, experts: int, top_k: int, corpus_bytes: int,
          seq: int = 128, batch: int = 16) -> tuple[Path, bytes, bytes]:
    import torch
    import transformers as T

    torch.manual_seed(0)
    data = corpus(corpus_bytes)
    split = int(len(data) * 0.95)
    train_b, held = data[:split], data[split:]
    cfg = T.Qwen3MoeConfig(vocab_size=259, hidden_size=128, intermediate_size=256,
                           moe_intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
                           max_position_embeddings=1024, bos_token_id=BOS, eos_token_id=EOS,
                           pad_token_id=PAD, tie_word_embeddings=False,
                           output_router_logits=True, router_aux_loss_coef=0.01)
    model = T.Qwen3MoeForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    arr = np.frombuffer(train_b, dtype=np.uint8)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    model.train()
    for step in range(steps):
        starts = rng.integers(0, len(arr) - seq - 1, batch)
        x = torch.tensor(np.stack([arr[s:s + seq] for s in starts]).astype(np.int64))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  step {step:5d} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    model.eval()
    hf = out / "learned-moe-hf"
    model.save_pretrained(hf)
    from colibri.tools.convert_hf import convert

    path = Path(convert(hf, out / "learned-moe.gguf", "f32"))
    return path, train_b, held


def measure(path: Path, record_text: bytes, held: bytes, n_tokens: int, threads: int) -> None:
    import colibri
    from colibri.usage import hit_share

    def feed(m: colibri.Model, text: bytes) -> None:
        s = m.new_sequence()
        for b in text[:n_tokens]:
            m.eval([s], tokens=[int(b)])
        m.free_sequence(s)

    with colibri.Model(str(path), threads=threads, ctx=max(64, n_tokens + 8), max_batch=1,
                       tokenizer=False, verbose=False, expert_usage=False) as m:
        feed(m, record_text)  # the "usage record": counts on the training text
        moe = [i for i, L in enumerate(m.desc.layers) if L.n_expert]
        rec = np.stack([m.route_counts(i) for i in moe]).astype(np.uint64)
        n_exp = m.desc.layers[moe[0]].n_expert
    with colibri.Model(str(path), threads=threads, ctx=max(64, n_tokens + 8), max_batch=1,
                       tokenizer=False, verbose=False, expert_usage=False, expert_mode="cache",
                       expert_budget=0.5, prefetch=True) as m:
        feed(m, held)
        m.experts.prefetch_sync()
        slots = m.expert_info()["n_slots"]
        print(f"held-out text, {n_tokens} tokens, cache budget 0.5 ({slots} slots of "
              f"{len(moe) * n_exp} experts), prefetch on:")
        print("  layer  precision  recall   top-25% share  top-50% share")
        for i in moe:
            st = m.expert_stats(i)
            c = np.sort(m.route_counts(i).astype(np.float64))[::-1]
            q = c[: max(1, n_exp // 4)].sum() / c.sum()
            h = c[: max(1, n_exp // 2)].sum() / c.sum()
            if st["predicted"]:
                p = st["predicted_used"] / st["predicted"]
                r = st["predicted_used"] / st["predicted_acquired"]
                print(f"  {i:5d}  {p * 100:8.1f}%  {r * 100:5.1f}%  {q * 100:12.1f}%  "
                      f"{h * 100:12.1f}%")
            else:
                print(f"  {i:5d}  {'-':>9}  {'-':>6}  {q * 100:12.1f}%  {h * 100:12.1f}%")
        st = m.expert_stats()
        print("  uniform routing would give precision = recall = top-k / experts and shares "
              "of 25% / 50%")
        print(f"  cache hit rate {st['hits'] / max(1, st['acquired']) * 100:.1f}% (LRU, with "
              f"prefetch); the usage record (training text) predicts "
              f"{hit_share(rec, slots) * 100:.1f}% for a cache holding its hottest experts")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for the model (default: a temporary)")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--eval-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus-bytes", type=int, default=4 << 20)
    a = ap.parse_args(argv)
    out = Path(a.out or tempfile.mkdtemp(prefix="colibri-learned-moe-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"training a {a.layers}-layer qwen3_moe ({a.experts} experts, top-{a.top_k}) for "
          f"{a.steps} steps in {out}", flush=True)
    path, train_b, held = train(out, a.steps, a.layers, a.experts, a.top_k, a.corpus_bytes)
    measure(path, train_b[-a.eval_tokens * 4:], held, a.eval_tokens, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
