"""Fuzzing the whole model path: mutated GGUF files and colibri containers through
`colibri.model.Model(path, ...)` and one short generation each.

    python tools/fuzz/model_fuzz.py --cases 10000 [--seed 0] [--out fuzz-out]
    python tools/fuzz/model_fuzz.py --seconds 600
    python tools/fuzz/model_fuzz.py --replay fuzz-out/crashes/case-123.gguf
    (or python -m colibri.tools.fuzz.harness ...)

Every case is derived from (seed, case index) alone, so a run is reproducible and a case can be
regenerated (`--only 123`). Seeds are tiny runnable models (colibri/tools/fuzz/seeds.py: a
qwen3moe MoE with a SentencePiece vocabulary, a dense llama with byte-level BPE, biases and rope
scaling, a gemma3 with sliding windows and K-quants, and the qwen3moe as a colibri container).
Mutations (colibri/tools/fuzz/mutate.py):

- metadata values: head counts, key/value lengths, embedding_length, block_count, rope
  (freq_base, dimension_count, scaling type/factor), norm epsilon, context length, expert
  counts, sliding window, softcaps, the architecture name - set to extreme numbers (0, -1,
  2^31, 2^64-1, NaN, inf, 1e-45, ...), retyped (float, string, bool, array), deleted;
- tokenizer arrays: tokens, scores, token types, merges, bos/eos ids, model / pre names
  (emptied, shortened, lengthened, duplicated, NaN scores, ids out of range, retyped);
- tensors: shapes (a dim zeroed, doubled, halved, swapped, one dropped or added), types
  (with the bytes kept, so inconsistent, or re-encoded so the file stays valid), NaN / inf /
  random bytes in the data, a tensor dropped or renamed;
- bytes: flips in the header, truncation, for containers header fields with the checksum
  recomputed (so the structural checks run).

Each case runs `Model(path, threads=1, ctx=32, max_batch=4)` and `generate(prompt,
max_tokens=2)` (greedy or seeded sampling, a random prompt). The outcome must be success or an
exception of an allowed class (ValueError - GGUFError, ContainerError, UnsupportedModel -,
OSError, MemoryError, ColibriError) raised from colibri's own code. Anything else is a failure:
another class (IndexError, KeyError, ZeroDivisionError, OverflowError, TypeError, ...), an
allowed class raised from inside numpy / gguf / the standard library or carrying one of their
generic messages (GENERIC_MESSAGES: a traceback from deep inside, not a message of ours), a crash (the batch's subprocess dies on a signal), or a hang
(a case over --timeout seconds). Cases run in worker subprocesses (--batch cases each); a
failing case's file and its description are saved under OUT/failures/ as a reproducer.
Prints a summary: cases, seconds, outcomes by exception class, failures, crashes, hangs.
Exit status 1 when anything failed.
"""


from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import colibri
from colibri.tools.fuzz.mutate import Seeds, make_case

ALLOWED = ("ValueError", "OSError", "MemoryError", "ColibriError")
# Python's / numpy's own wording: an allowed class with one of these messages escaped from a
# builtin or numpy call in colibri's code without a check of its own, so it names nothing
GENERIC_MESSAGES = ("truth value of an array", "math domain error", "invalid literal for int",
                    "could not convert", "cannot convert float", "zero-size array",
                    "division by zero", "only 0-dimensional", "setting an array element",
                    "cannot reshape", "operands could not be broadcast", "out of bounds for",
                    "not enough values to unpack", "too many values to unpack",
                    "negative dimensions", "Maximum allowed dimension", "index out of range")

# the colibri package the cases run (a worker imports the same one: drive puts its parent first
# on the worker's PYTHONPATH)
_PKG = os.path.dirname(os.path.abspath(colibri.__file__)) + os.sep
_PKG_PARENT = os.path.dirname(os.path.dirname(_PKG))



def run_case(path: str, desc: dict[str, Any]) -> tuple[str, str, str]:
    """(outcome, exception class, message): outcome is ok, allowed or unexpected."""
    from colibri.model import Model

    try:
        m = Model(path, threads=1, ctx=32, max_batch=4, expert_mode=desc["expert_mode"],
                  expert_budget=None)
        try:
            m.generate(desc["prompt"], max_tokens=2, temperature=desc["temperature"], seed=1)
        finally:
            m.close()
    except Exception as e:  # noqa: BLE001 - the point is to classify everything
        cls = type(e)
        names = [c.__name__ for c in cls.__mro__]
        allowed = next((a for a in ALLOWED if a in names), None)
        tb = traceback.extract_tb(e.__traceback__)
        origin = tb[-1].filename if tb else ""
        ours = origin.startswith((_PKG, "colibri/"))
        msg = f"{e}"[:300]
        generic = any(g in msg for g in GENERIC_MESSAGES)
        if allowed is None or not ours or not msg or generic:
            detail = "".join(traceback.format_exception(e)[-6:])
            return "unexpected", cls.__name__, f"{msg} | raised at {origin}:{tb[-1].lineno if tb else 0}\n{detail}"
        return "allowed", cls.__name__, msg
    return "ok", "", ""


# ---- worker and driver ----

def worker(args: argparse.Namespace) -> int:
    os.makedirs(args.workdir, exist_ok=True)
    seeds = Seeds(args.workdir)
    out = sys.stdout
    for i in range(args.start, args.end):
        try:
            path, desc = make_case(seeds, args.seed, i, args.workdir)
        except Exception as e:  # noqa: BLE001 - a bug of this generator, reported as such
            msg = f"{type(e).__name__}: {e}".replace("\t", " ").replace("\n", " ")
            out.write(f"start\t{i}\ndone\t{i}\tgenerator\tGENERATOR-BUG\t{msg}\n")
            out.flush()
            continue
        with open(os.path.join(args.workdir, "current.json"), "w") as f:
            json.dump({"path": path, **desc}, f)
        out.write(f"start\t{i}\n")
        out.flush()
        if os.environ.get("COLIBRI_FUZZ_SELFTEST") == f"crash:{i}":  # the harness's own test
            os.kill(os.getpid(), signal.SIGSEGV)
        if os.environ.get("COLIBRI_FUZZ_SELFTEST") == f"hang:{i}":
            time.sleep(3600)
        outcome, cls, msg = run_case(path, desc)
        if outcome == "unexpected":
            _save(args.out, i, path, desc, f"{cls}: {msg}")
        out.write("done\t{}\t{}\t{}\t{}\n".format(i, outcome, cls, msg.split("\n")[0].replace("\t", " ")))
        out.flush()
    out.write("end\n")
    out.flush()
    return 0


def _save(out: str, index: int, path: str, desc: dict[str, Any], why: str) -> str:
    d = os.path.join(out, "failures")
    os.makedirs(d, exist_ok=True)
    ext = os.path.splitext(path)[1]
    dst = os.path.join(d, f"case-{desc.get('seed', 0)}-{index}{ext}")
    try:
        shutil.copyfile(path, dst)
    except OSError:
        pass
    with open(dst + ".json", "w") as f:
        json.dump({**desc, "why": why}, f, indent=1)
    return dst


@dataclass
class Summary:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)
    messages: dict[str, Counter[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    crashes: int = 0
    hangs: int = 0
    unexpected: int = 0


def drive(seed: int, start: int, cases: int | None, seconds: float | None, batch: int,
          timeout: float, out: str, verbose: bool = False) -> Summary:
    s = Summary()
    t_end = time.monotonic() + seconds if seconds else None
    workdir = tempfile.mkdtemp(prefix="colibri-fuzz-")
    nxt = start
    stop = start + cases if cases is not None else None
    try:
        while (stop is None or nxt < stop) and (t_end is None or time.monotonic() < t_end):
            end = nxt + batch if stop is None else min(stop, nxt + batch)
            cmd = [sys.executable, "-m", "colibri.tools.fuzz.harness", "--worker", "--seed",
                   str(seed), "--start", str(nxt), "--end", str(end), "--workdir", workdir,
                   "--out", out]
            env = dict(os.environ,
                       PYTHONPATH=_PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            assert p.stdout is not None
            current = None
            buf = b""
            deadline = time.monotonic() + 120  # seeds + imports
            finished = hung = False
            while not finished:
                r, _, _ = select.select([p.stdout], [], [], 0.5)
                if r:
                    chunk = os.read(p.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        parts = line.decode("utf-8", "replace").split("\t")
                        if parts[0] == "start":
                            current = int(parts[1])
                            deadline = time.monotonic() + timeout
                        elif parts[0] == "done":
                            _record(s, parts, verbose)
                            current = None
                        elif parts[0] == "end":
                            finished = True
                elif p.poll() is not None:
                    break
                if not finished and time.monotonic() > deadline:
                    p.kill()
                    hung = True
                    break
            rc = p.wait()
            err = p.stderr.read().decode("utf-8", "replace") if p.stderr else ""
            if finished:
                nxt = end
                continue
            if current is None:
                raise RuntimeError(f"fuzz worker failed outside a case (rc {rc}):\n{err[-4000:]}")
            s.cases += 1
            if hung:
                s.hangs += 1
                s.classes["HANG"] += 1
                s.failures.append(f"case {current}: hang (over {timeout} s): "
                                  f"{_save_current(workdir, out, current, 'hang')}")
            else:
                s.crashes += 1
                s.classes[f"CRASH(rc={rc})"] += 1
                why = f"crash, exit status {rc}: {err[-2000:]}"
                s.failures.append(f"case {current}: {why[:300]} -> "
                                  f"{_save_current(workdir, out, current, why)}")
            nxt = current + 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return s


def _record(s: Summary, parts: list[str], verbose: bool) -> None:
    i, outcome, cls, msg = int(parts[1]), parts[2], parts[3], "\t".join(parts[4:])
    s.cases += 1
    s.outcomes[outcome] += 1
    key = cls or "ok"
    s.classes[key] += 1
    s.messages.setdefault(key, Counter())[msg[:90]] += 1
    if outcome == "unexpected":
        s.unexpected += 1
        s.failures.append(f"case {i}: {cls}: {msg}")
    if verbose:
        print(f"{i} {outcome} {cls} {msg[:120]}", flush=True)


def _save_current(workdir: str, out: str, index: int, why: str) -> str:
    try:
        with open(os.path.join(workdir, "current.json")) as f:
            desc = json.load(f)
    except (OSError, ValueError):
        desc = {"index": index}
    return _save(out, index, desc.get("path", ""), desc, why)


def print_summary(s: Summary, seconds: float, file: Any = sys.stdout) -> None:
    print(f"cases: {s.cases} in {seconds:.1f} s ({s.cases / max(seconds, 1e-9):.0f}/s)", file=file)
    print(f"outcomes: ok {s.outcomes['ok']}, allowed exceptions {s.outcomes['allowed']}, "
          f"unexpected exceptions {s.unexpected}, crashes {s.crashes}, hangs {s.hangs}", file=file)
    print("by class:", file=file)
    for cls, n in s.classes.most_common():
        print(f"  {cls:28s} {n:7d}", file=file)
        for msg, k in (s.messages.get(cls) or Counter()).most_common(3):
            if msg:
                print(f"      {k:6d}  {msg}", file=file)
    for f in s.failures[:30]:
        print(f"FAIL {f[:500]}", file=file)


def replay(path: str, desc_path: str | None) -> int:
    desc = {"prompt": "hello world", "temperature": 0.0, "expert_mode": None}
    if desc_path or os.path.exists(path + ".json"):
        with open(desc_path or path + ".json") as f:
            desc.update({k: v for k, v in json.load(f).items() if k in desc})
    outcome, cls, msg = run_case(path, desc)
    print(outcome, cls, msg)
    return 0 if outcome != "unexpected" else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="number of cases (default 1000 "
                    "without --seconds)")
    ap.add_argument("--seconds", type=float, default=None, help="time budget instead of a count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--batch", type=int, default=500, help="cases per worker subprocess")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it "
                    "counts as a hang")
    ap.add_argument("--out", default="fuzz-out", help="where failing cases are saved")
    ap.add_argument("--only", type=int, default=None, help="run (and keep) one case by index")
    ap.add_argument("--replay", default=None, help="run one saved case file")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.replay:
        return replay(args.replay, None)
    if args.only is not None:
        d = tempfile.mkdtemp(prefix="colibri-fuzz-one-")
        path, desc = make_case(Seeds(d), args.seed, args.only, d)
        print(json.dumps(desc, indent=1))
        outcome, cls, msg = run_case(path, desc)
        print(outcome, cls, msg)
        saved = _save(args.out, args.only, path, desc, f"{outcome} {cls}: {msg}")
        print(f"case saved as {saved}")
        return 0 if outcome != "unexpected" else 1
    cases = args.cases if args.cases is not None or args.seconds else 1000
    t0 = time.monotonic()
    s = drive(args.seed, args.start, cases, args.seconds, args.batch, args.timeout, args.out,
              args.verbose)
    print_summary(s, time.monotonic() - t0)
    return 1 if (s.unexpected or s.crashes or s.hangs) else 0


if __name__ == "__main__":
    sys.exit(main())
