"""colibri: run Mixture-of-Experts language models from GGUF files, with a C core."""

from colibri.container import ContainerError, ContainerFile
from colibri.errors import ColibriError
from colibri.gguf import GGUFError, GGUFFile
from colibri.kv import KVArena, KVCache
from colibri.tokenizer import StreamDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = ["ColibriError", "ContainerError", "ContainerFile", "GGUFError", "GGUFFile", "KVArena", "KVCache", "StreamDecoder", "Tokenizer", "__version__"]
