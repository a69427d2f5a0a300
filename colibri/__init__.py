"""colibri: run Mixture-of-Experts language models from GGUF files, with a C core."""

from colibri.errors import ColibriError
from colibri.gguf import GGUFError, GGUFFile
from colibri.kv import KVArena, KVCache

__version__ = "0.1.0"

__all__ = ["ColibriError", "GGUFError", "GGUFFile", "KVArena", "KVCache", "__version__"]
