"""llama.cpp's own programs (llama-server, llama-quantize, llama-imatrix...) built from the
llama.cpp sources that llama-cpp-python's sdist vendors, for the tools that compare colibri with
llama.cpp (tools/bench/serve.py, tools/quantize_lowbit_refs.py). One build folder, cached in
~/.cache/colibri/llama.cpp: the sdist (`pip download --no-binary llama-cpp-python`), unpacked;
cmake (`pip install cmake` when missing); a Release build with GGML_NATIVE=ON, static,
only the targets asked for (minutes each on two cores; an existing binary is never rebuilt).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "colibri" / "llama.cpp"
LLAMA_CPP_PYTHON = "0.3.36"


def binary(target: str, cache: Path = CACHE) -> Path:
    """Where the build puts `target`'s program (it may not exist yet)."""
    return cache / "build" / "bin" / target


def sources(cache: Path = CACHE) -> Path:
    """The unpacked sdist's vendored llama.cpp (downloaded and unpacked when missing)."""
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        sdist = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
        if not sdist.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary",
                            "llama-cpp-python", "--no-deps",
                            f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(cache)],
                           check=True)
        subprocess.run(["tar", "xzf", str(sdist), "-C", str(cache)], check=True)
    return src / "vendor" / "llama.cpp"


def build(*targets: str, cache: Path = CACHE) -> dict[str, str]:
    """Build the llama.cpp `targets` (CMake target names: "llama-server", "llama-quantize",
    "llama-imatrix") that are not built yet; {target: path of its program}."""
    missing = [t for t in targets if not binary(t, cache).is_file()]
    if missing:
        src = sources(cache)
        if shutil.which("cmake") is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "cmake"], check=True)
        out = cache / "build"
        subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
                        "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
                        "-DLLAMA_BUILD_TOOLS=ON", "-DBUILD_SHARED_LIBS=OFF"], check=True)
        for t in missing:
            subprocess.run(["cmake", "--build", str(out), "--target", t, "-j",
                            str(os.cpu_count() or 2)], check=True)
    return {t: str(binary(t, cache)) for t in targets}
