"""Build colibri: one static C library (colibri/_core/*.c) linked into the one Cython extension
module, colibri._core._native (colibri/_core/_native.pyx, which includes one _*.pxi per header).

Flags: -O3 and the host's instruction set by default; COLIBRI_PORTABLE=1 builds for generic
x86-64 (the SIMD kernels are still compiled, per function, with target attributes and chosen at
run time). COLIBRI_DEBUG=1 builds -O0 -g.
"""

import glob
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
os.chdir(HERE)

portable = os.environ.get("COLIBRI_PORTABLE", "0") not in ("", "0")
debug = os.environ.get("COLIBRI_DEBUG", "0") not in ("", "0")

cflags = ["-std=c11", "-Wall", "-Wextra", "-fPIC", "-D_GNU_SOURCE", "-pthread"]
if debug:
    cflags += ["-O0", "-g"]
else:
    cflags += ["-O3"]
if platform.machine() in ("x86_64", "AMD64"):
    cflags += ["-march=x86-64", "-mtune=generic"] if portable else ["-march=native"]
    if portable:
        cflags += ["-DCB_PORTABLE=1"]
elif not portable and sys.platform != "darwin":
    cflags += ["-mcpu=native"]

c_sources = sorted(glob.glob("colibri/_core/*.c"))
# Cython's generated C goes to build/cython, never beside the hand-written sources.
NATIVE = "colibri._core._native"

libraries = [
    (
        "colibri_c",
        {
            "sources": c_sources,
            "include_dirs": ["include", "colibri/_core", "cuda"],
            "cflags": cflags,
            # Rebuild every object when any header changes (headers are few and small).
            "obj_deps": {"": sorted(glob.glob("include/colibri/*.h") + glob.glob("colibri/_core/*.h"))},
        },
    )
]

extensions = [
    Extension(
        NATIVE,
        ["colibri/_core/_native.pyx"],
        include_dirs=["include", "colibri/_core", "cuda"],
        extra_compile_args=[f for f in cflags if f != "-std=c11"] + ["-Wno-unused-function"],
        extra_link_args=["-pthread"],
        libraries=["m"],
        # relink (and recompile) when any C source or header of the static library changes
        depends=c_sources + sorted(glob.glob("include/colibri/*.h") + glob.glob("colibri/_core/*.h")
                                   + glob.glob("cuda/*.h")),
    )
]



class build_clib_parallel(build_clib):
    """setuptools compiles a C library's sources one after another; compile them on every core
    (COLIBRI_BUILD_JOBS caps it), one compiler process per source, then archive as before."""

    def build_libraries(self, libraries):
        one_by_one = self.compiler.compile
        jobs = int(os.environ.get("COLIBRI_BUILD_JOBS", "0") or 0) or os.cpu_count() or 1

        def compile_parallel(sources, *args, **kwargs):
            if len(sources) < 2 or jobs < 2:
                return one_by_one(sources, *args, **kwargs)
            with ThreadPoolExecutor(jobs) as pool:
                parts = list(pool.map(lambda src: one_by_one([src], *args, **kwargs), sources))
            return [obj for part in parts for obj in part]

        self.compiler.compile = compile_parallel
        try:
            super().build_libraries(libraries)
        finally:
            self.compiler.compile = one_by_one


class build_ext_with_clib(build_ext):
    """Build the static C library first, so `build_ext --inplace` alone works. An in-place build
    also removes the extension modules of earlier layouts (one per concept: _arena, _forward,
    ...), which would otherwise shadow the Python modules of the same names."""

    def run(self):
        self.run_command("build_clib")
        super().run()
        if self.inplace:
            for path in glob.glob("colibri/_core/_*.so") + glob.glob("colibri/_core/_*.pyd"):
                if not os.path.basename(path).startswith("_native."):
                    os.remove(path)


class build_py_with_kernels(build_py):
    """Ship the CUDA kernel sources (cuda/*.cu, *.cuh and the headers they include) inside the
    package as colibri/_cuda_src, so an installed colibri compiles its kernels without the
    source tree (colibri.cuda.kernel_dir looks there first)."""

    def run(self):
        super().run()
        if self.editable_mode:
            return  # an editable install reads cuda/ in the source tree
        dest = os.path.join(self.build_lib, "colibri", "_cuda_src")
        os.makedirs(dest, exist_ok=True)
        for src in sorted(glob.glob("cuda/*.cu") + glob.glob("cuda/*.cuh") + glob.glob("cuda/*.h")):
            self.copy_file(src, os.path.join(dest, os.path.basename(src)))
        with open(os.path.join(dest, "__init__.py"), "w") as f:
            f.write('"""The CUDA kernel sources (a copy of cuda/ made at build time)."""\n')


setup(
    cmdclass={"build_clib": build_clib_parallel, "build_ext": build_ext_with_clib,
              "build_py": build_py_with_kernels},
    libraries=libraries,
    ext_modules=cythonize(
        extensions,
        build_dir="build/cython",
        language_level=3,
        # Cython's bounds checks and negative-index wraparound stay on in every module: the
        # wrappers are thin (the hot loops are in C) and turning them off measured no faster
        # (docs/ARCHITECTURE.md, "Checks at the boundary"), while an unchecked index from a
        # caller read out of bounds.
        compiler_directives={"embedsignature": True},
    ),
)
