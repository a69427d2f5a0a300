"""Session-wide test settings."""

from __future__ import annotations

import os


def pytest_configure(config: object) -> None:
    # The expert usage record (colibri.usage) lives in the user's cache folder and pins experts
    # at load: tests must neither write there nor see each other's records through it (cache
    # statistics would depend on test order). tests/test_usage.py turns it on explicitly, with
    # a temporary folder.
    os.environ.setdefault("COLIBRI_EXPERT_USAGE", "0")
