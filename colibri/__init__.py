"""colibri: run Mixture-of-Experts language models from GGUF files, with a C core."""

from colibri.errors import ColibriError

__version__ = "0.1.0"

__all__ = ["ColibriError", "__version__"]
