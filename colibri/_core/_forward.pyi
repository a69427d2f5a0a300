from typing import Any

import numpy as np

class ExpertStore:
    n_layers: int
    def __init__(self, desc: Any) -> None: ...
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
