import numpy as np
import numpy.typing as npt

ATTR_UNDEFINED: int
ATTR_UNKNOWN: int
ATTR_UNUSED: int
ATTR_NORMAL: int
ATTR_CONTROL: int
ATTR_USER_DEFINED: int
ATTR_BYTE: int
MODEL_SPM: int
MODEL_BPE: int
BPE_RAW_UTF8: int
BPE_ESCAPE_SPACES: int
BPE_NEWLINE_WORDS: int
PRE_IDS: dict[str, int]

def utf8_validate(data: bytes) -> None: ...
def utf8_sanitize(data: bytes) -> bytes: ...

class CStream:
    def __init__(self, parent: CTokenizer, special: bool) -> None: ...
    def feed(self, id: int) -> str: ...
    def flush(self) -> str: ...

class CTokenizer:
    def __init__(
        self,
        model: int,
        pre: int,
        text: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.int64],
        scores: npt.NDArray[np.float32],
        attrs: npt.NDArray[np.uint32],
        merges: npt.NDArray[np.uint8],
        merge_offsets: npt.NDArray[np.int64],
        bos_id: int,
        eos_id: int,
        add_bos: bool,
        add_eos: bool,
        add_space_prefix: bool,
        ignore_merges: bool,
        bpe_flags: int = 0,
    ) -> None: ...
    @property
    def n_tokens(self) -> int: ...
    def encode(
        self, text: bytes, add_special: bool, parse_special: bool, lenient: bool
    ) -> npt.NDArray[np.int32]: ...
    def decode(self, ids: npt.NDArray[np.int32], special: bool) -> str: ...
    def piece(self, id: int, special: bool) -> bytes: ...
    def stream(self, special: bool) -> CStream: ...
