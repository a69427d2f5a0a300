"""Tools that ship with the package: `python -m colibri.tools.make_bench_model OUT.gguf`."""
