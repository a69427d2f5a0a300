"""The name colibri is installed under (its PyPI distribution), and the install line for an
extra. The import name is `colibri`; the distribution is not: `colibri` on PyPI is an unrelated
project (an AMQP client), so an install line naming it would fetch a stranger's code. Every
message that tells a user what to install comes from install_hint()."""

from __future__ import annotations

DIST_NAME = "colibri-moe"


def install_hint(extra: str | None = None) -> str:
    """`pip install "colibri-moe[extra]"` (the extra's packages, and colibri itself)."""
    return f'pip install "{DIST_NAME}[{extra}]"' if extra else f'pip install "{DIST_NAME}"'
