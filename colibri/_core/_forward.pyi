from typing import Any

import numpy as np

class ExpertStore:
    n_layers: int
    mode: str
    policy: str
    def __init__(self, desc: Any, mode: str = "mapped", path: str | bytes | None = None,
                 budget_bytes: int = 0, policy: str = "lru", min_slots: int = 1,
                 huge_pages: bool = True, mlock: bool = False) -> None: ...
    def info(self) -> dict[str, Any]: ...
    def pin(self, layer: int, expert: int) -> None: ...
    def _address(self) -> int: ...
    def stats(self, layer: int = -1) -> dict[str, float]: ...
    def route_counts(self, layer: int) -> np.ndarray: ...
    def reset_stats(self) -> None: ...

class Forward:
    desc: Any
    kv: Any
    experts: ExpertStore | None
    pool: Any
    max_batch: int
    n_vocab: int
    n_embd: int
    def __init__(self, desc: Any, kv: Any, experts: ExpertStore | None, pool: Any,
                 max_batch: int = 512) -> None: ...
    def run(self, seq: Any, pos: Any, tokens: Any = None, embd: Any = None,
            logits: Any = None) -> np.ndarray: ...
