"""Tools that ship with the package (the scripts under tools/ in a checkout are thin command
lines over them, and tests import them from here, never the scripts):

- make_bench_model: `python -m colibri.tools.make_bench_model OUT.gguf` (random benchmark MoEs);
- convert_hf: `python -m colibri.tools.convert_hf MODEL_DIR OUT.gguf` (Hugging Face -> GGUF);
- fuzz/: the model fuzzer (seed models, mutations, harness; tools/fuzz/model_fuzz.py);
- cuda_check/: the CUDA kernels' check on a lent GPU and its CPU reference path
  (tools/bench/cuda_check.py).
"""
