"""Fixtures of the server tests: no API key inherited from the caller's environment, and the
tiny random MoE model the servers run (fast to load), made once per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def _no_key_from_the_environment() -> Iterator[None]:
    """The servers start() runs inherit os.environ: a COLIBRI_API_KEY of the caller's would
    make them require a key."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COLIBRI_API_KEY", raising=False)
        yield


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from colibri.tools.make_bench_model import write

    return str(write(str(tmp_path_factory.mktemp("serve") / "tiny.gguf"), n_layers=2,
                     shape="tiny"))
