"""The mutation report: per-area scores, survivors, equivalents (tools/mutation/run.py)."""

from __future__ import annotations

import json
from pathlib import Path

BEGIN = "<!-- mutation:results:begin (tools/mutation/run.py rewrites this part) -->"
END = "<!-- mutation:results:end -->"


def load_equivalents(path: Path) -> dict[str, str]:
    """mutant id -> why it cannot change behaviour (one a line: the id, whitespace, the
    reason; # comments)."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for ln in path.read_text().splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        mid, _, why = ln.partition(" ")
        if not why.strip():
            raise SystemExit(f"{path}: {mid} has no reason (one line: id, then why)")
        out[mid] = why.strip()
    return out


def summary(r: dict, equivalents: dict[str, str]) -> dict:
    res = r["results"]
    count = lambda *st: sum(1 for x in res if x["status"] in st)  # noqa: E731
    # a listed equivalent counts only where it survived (one a test killed was no equivalent)
    equiv = [x for x in res if x["id"] in equivalents
             and x["status"] not in ("killed", "timeout", "stillborn", "not run")]
    stillborn = count("stillborn")
    not_run = count("not run")  # a run stopped before it reached them
    killed = count("killed", "timeout")
    listed_killed = [x["id"] for x in res if x["id"] in equivalents
                     and x["status"] in ("killed", "timeout")]
    survivors = [x for x in res if x["status"] not in ("killed", "timeout", "stillborn",
                                                         "not run")
                 and x["id"] not in equivalents]
    counted = len(res) - stillborn - not_run - len(equiv)
    return {"area": r["area"], "kind": r["kind"], "all": len(res), "killed": killed,
            "timeout": count("timeout"), "survived": len(survivors),
            "no_tests": sum(1 for x in survivors if x["status"] == "no tests"),
            "equivalent": len(equiv), "listed_but_killed": listed_killed,
            "stillborn": stillborn, "not_run": not_run,
            "counted": counted,
            "score": 100.0 * killed / counted if counted else 100.0,
            "seconds": r["seconds"], "survivors": survivors, "sites": r.get("sites"),
            "sample": r["sample"], "seed": r["seed"], "files": r["files"], "tests": r["tests"]}


def line(s: dict) -> str:
    return (f"{s['area']}: {s['killed']}/{s['counted']} killed = {s['score']:.1f}% "
            f"({s['all']} mutants, {s['timeout']} timeouts, {s['survived']} survived "
            f"[{s['no_tests']} reached by no test], {s['equivalent']} equivalent, "
            f"{s['stillborn']} stillborn, {s['not_run']} not run; {s['seconds']:.0f} s)")


def render(results_dir: Path, equivalents: dict[str, str]) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    sums = [summary(r, equivalents) for r in runs]
    out = [BEGIN, "", "| area | kind | mutants | killed (timeouts) | survived (no test) | "
           "equivalent | stillborn | not run | score | run time |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in sums:
        n = f"{s['all']}" + (f" of {s['sites']} (seed {s['seed']})" if s["sites"] else "")
        out.append(f"| {s['area']} | {s['kind']} | {n} | {s['killed']} ({s['timeout']}) | "
                   f"{s['survived']} ({s['no_tests']}) | {s['equivalent']} | {s['stillborn']} "
                   f"| {s['not_run']} | **{s['score']:.1f}%** | {s['seconds']:.0f} s |")
    out.append("")
    for s in sums:
        out.append(f"### {s['area']}: survivors")
        out.append("")
        out.append(f"Files: {', '.join(s['files'])}; tests: {', '.join(s['tests'])}.")
        out.append("")
        if not s["survivors"]:
            out.append("None.")
        for x in s["survivors"]:
            diff = x["diff"].replace("\n", "` / `")
            out.append(f"- `{x['id']}` ({x['status']}): `{diff}`")
        out.append("")
    ids = {x["id"] for r in runs for x in r["results"]}
    eq = [(k, v) for k, v in equivalents.items() if k in ids]
    out.append("### Equivalent mutants (tools/mutation/equivalent.txt)")
    out.append("")
    out.extend(f"- `{k}`: {v}" for k, v in eq) if eq else out.append("None in these runs.")
    out.extend(["", END])
    return "\n".join(out)


def write(path: Path, results_dir: Path, equivalents: dict[str, str]) -> None:
    """Rewrites the generated part of path (between the markers), keeping the rest."""
    body = render(results_dir, equivalents)
    text = path.read_text() if path.exists() else "# Mutation testing\n\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + body + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text)
