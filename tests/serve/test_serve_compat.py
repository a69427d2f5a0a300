"""llama.cpp's server tests for the Responses and Anthropic Messages APIs
(tools/server/tests/unit/test_compat_oai_responses.py and test_compat_anthropic.py), ported to
colibri.tools.compat, run against one `colibri serve` on the tiny random MoE model: every
ported case passes, and the cases left out are exactly the documented llama-server-only ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import fastapi  # noqa: F401  the serve extra (test extras)
import llguidance  # noqa: F401
import openai  # noqa: F401  the Responses cases use the official client
import pytest

from colibri.tools import compat

# the llama.cpp cases that test llama-server's own things, and why (one line each)
NOT_APPLICABLE = {
    "test_responses_stream_with_llama_telemetry": "timings_per_token",
    "test_anthropic_vision_base64_with_multimodal_model": "tinygemma3",
    "test_anthropic_thinking_with_reasoning_model[False]": "DeepSeek-R1",
    "test_anthropic_thinking_with_reasoning_model[True]": "DeepSeek-R1",
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[compat.Harness]:
    d = tmp_path_factory.mktemp("serve_compat")
    h = compat.start(compat.tiny_model(str(d)), str(d / "log"))
    try:
        yield h
    finally:
        rc = h.stop()
        assert rc == 0, h.log()


def test_not_applicable_is_the_documented_list():
    assert set(compat.NOT_APPLICABLE) == set(NOT_APPLICABLE)
    for name, word in NOT_APPLICABLE.items():
        reason = compat.NOT_APPLICABLE[name]
        assert word in reason and "\n" not in reason, (name, reason)
    assert not set(compat.CASES) & set(compat.NOT_APPLICABLE)
    # every case of the two llama.cpp files is accounted for: 7 Responses, 27 Messages
    names = compat.all_names()
    assert sum(n.startswith("test_responses_") for n in names) == 7
    assert sum(n.startswith("test_anthropic_") for n in names) == 27


@pytest.mark.slow
@pytest.mark.parametrize("name", list(compat.CASES))
def test_ported_case(harness: compat.Harness, name: str) -> None:
    outcome, detail = compat.run_case(harness, name)
    assert outcome == "pass", f"{name}: {detail}"


def test_runner_lists_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert compat.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == compat.all_names()
