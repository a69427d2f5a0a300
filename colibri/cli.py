"""The `colibri` command line: run, chat, bench, doctor, plan.

Errors a user meets (missing file, not a GGUF, unsupported architecture, not enough memory)
are one readable line on stderr and exit status 1, not a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", help="GGUF file (default: Gemma 3 270M from colibri[demo])")
    p.add_argument("--threads", type=int, default=None,
                   help="compute threads (default: COLIBRI_ROUTING_THREADS or all cores)")
    p.add_argument("--ctx", type=int, default=None,
                   help="KV cache size in tokens (default: COLIBRI_KV_CACHE_SIZE or 4096)")
    p.add_argument("--expert-mode", choices=("mapped", "cache", "mmap"), default=None,
                   help="where routed experts come from (default: mapped, or cache with a budget)")
    p.add_argument("--expert-budget", default=None,
                   help="bytes of experts kept resident: 2GB, 512MiB, 0.5 (a fraction) or auto")
    p.add_argument("--expert-policy", choices=("lru", "lfru"), default="lru",
                   help="eviction policy of the expert store")
    p.add_argument("--no-verify", action="store_true",
                   help="colibri container: skip the data checksums at load")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="prefetch the next layer's predicted experts in the background "
                        "(cache and mmap modes; default: COLIBRI_EXPERT_PREFETCH, else off)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: run routing and the routed experts of MoE layers on the GPU "
                        "(PyCUDA); the rest stays on the CPU")
    p.add_argument("--cuda-weights", choices=("f16", "int4-g128"), default="f16",
                   help="format of the experts on the GPU")
    p.add_argument("--cuda-expert-budget", default=None,
                   help="device bytes for experts (2GB, or a fraction such as 0.25): a device "
                        "expert cache staged from the expert store (default: all experts)")


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="colibri", description="Run Mixture-of-Experts language models from GGUF files."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("doctor", help="report what this machine offers colibri and what to fix")
    pl = sub.add_parser("plan", help="dense and expert sizes, the expert budget and peak memory")
    pl.add_argument("-m", "--model", required=True, help="GGUF file")
    pl.add_argument("--ctx", type=int, default=4096, help="KV cache size in tokens")
    pl.add_argument("--max-batch", type=int, default=512, help="tokens per forward batch")

    r = sub.add_parser("run", help="stream the continuation of a prompt, then a stats line")
    _add_model_args(r)
    r.add_argument("prompt_pos", nargs="?", metavar="PROMPT")
    r.add_argument("-p", "--prompt", help="the prompt (or give it as the positional argument)")
    r.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate")
    r.add_argument("--temp", type=float, default=0.8, help="temperature (0 = greedy)")
    r.add_argument("--top-k", type=int, default=40)
    r.add_argument("--top-p", type=float, default=0.95)
    r.add_argument("--min-p", type=float, default=0.05)
    r.add_argument("--repeat-penalty", type=float, default=1.0)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")

    c = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _add_model_args(c)
    c.add_argument("-n", "--n-predict", type=int, default=256)
    c.add_argument("--temp", type=float, default=0.8)
    c.add_argument("--seed", type=int, default=None)
    c.add_argument("--system", default=None, help="a system message")

    cv = sub.add_parser("convert", help="re-lay a GGUF out as a colibri container (each expert "
                        "one aligned read; optional expert requantization)")
    from colibri.container import add_convert_args

    add_convert_args(cv)

    b = sub.add_parser("bench", help="prefill/decode speed, latency and memory (vs llama.cpp)")
    b.add_argument("-m", "--model", help="GGUF file (default: Gemma 3 270M)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--prompt-tokens", type=int, default=128)
    b.add_argument("--gen-tokens", type=int, default=32)
    b.add_argument("--ctx", type=int, default=2048)
    b.add_argument("--vs-llama-cpp", action="store_true",
                   help="also run llama-cpp-python on the same file and report ratios")
    b.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def _load(args: argparse.Namespace):
    from colibri.model import Model, default_model_path

    path = args.model or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    return Model(path, threads=args.threads, ctx=args.ctx,
                 expert_mode=getattr(args, "expert_mode", None),
                 expert_budget=_budget_arg(getattr(args, "expert_budget", None)),
                 expert_policy=getattr(args, "expert_policy", "lru"),
                 verify=not getattr(args, "no_verify", False),
                 prefetch=getattr(args, "prefetch", None),
                 device=getattr(args, "device", "cpu"),
                 cuda_weights=getattr(args, "cuda_weights", "f16"),
                 cuda_expert_budget=_budget_arg(getattr(args, "cuda_expert_budget", None)))


def _budget_arg(raw: str | None) -> str | float | None:
    """--expert-budget: "auto", a size string, or a fraction such as 0.5."""
    if raw is None or raw == "auto":
        return raw
    try:
        v = float(raw)
    except ValueError:
        return raw
    return v if v <= 1.0 else raw


def _run(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else args.prompt_pos
    if prompt is None:
        if sys.stdin.isatty():
            raise ValueError("give a prompt: colibri run -p 'Once upon a time'")
        prompt = sys.stdin.read()
    model = _load(args)
    out = sys.stdout
    for piece in model.stream(prompt, max_tokens=args.n_predict, temperature=args.temp,
                              top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              repeat_penalty=args.repeat_penalty, seed=args.seed, stop=args.stop):
        out.write(piece)
        out.flush()
    out.write("\n")
    print(model.last_stats.line(), file=sys.stderr)
    return 0


def _chat(args: argparse.Namespace) -> int:
    model = _load(args)
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("colibri chat: an empty line or Ctrl-D ends the conversation", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        reply = []
        for piece in model.chat(messages, max_tokens=args.n_predict, stream=True,
                                temperature=args.temp, seed=args.seed):
            reply.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json

    from colibri import bench
    from colibri.model import default_model_path

    path = args.model or default_model_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file not found: {path}")
    res = bench.bench(path, args.threads, args.prompt_tokens, args.gen_tokens, args.vs_llama_cpp,
                      args.ctx)
    print(json.dumps(res, indent=2) if args.json else bench.report(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from colibri.errors import ColibriError

    try:
        if args.command == "doctor":
            from colibri.doctor import run

            return run()
        if args.command == "plan":
            from colibri.plan import run as plan_run

            return plan_run(args.model, args.ctx, args.max_batch)
        if args.command == "run":
            return _run(args)
        if args.command == "chat":
            return _chat(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "convert":
            from colibri.container import run_convert

            return run_convert(args)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, MemoryError, ColibriError) as e:
        print(f"colibri {args.command}: error: {e}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
