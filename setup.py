"""Build colibri: one static C library (colibri/_core/*.c) linked into one Cython extension per
header (colibri/_core/_*.pyx).

Flags: -O3 and the host's instruction set by default; COLIBRI_PORTABLE=1 builds for generic
x86-64 (the SIMD kernels are still compiled, per function, with target attributes and chosen at
run time). COLIBRI_DEBUG=1 builds -O0 -g.
"""

import glob
import os
import platform
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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
pyx_modules = sorted(glob.glob("colibri/_core/_*.pyx"))

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
        "colibri._core." + os.path.splitext(os.path.basename(p))[0],
        [p],
        include_dirs=["include", "colibri/_core", "cuda"],
        extra_compile_args=[f for f in cflags if f != "-std=c11"] + ["-Wno-unused-function"],
        extra_link_args=["-pthread"],
        libraries=["m"],
        # relink (and recompile) when any C source or header of the static library changes
        depends=c_sources + sorted(glob.glob("include/colibri/*.h") + glob.glob("colibri/_core/*.h")
                                   + glob.glob("cuda/*.h")),
    )
    for p in pyx_modules
]



class build_ext_with_clib(build_ext):
    """Build the static C library first, so `build_ext --inplace` alone works."""

    def run(self):
        self.run_command("build_clib")
        super().run()


setup(
    cmdclass={"build_ext": build_ext_with_clib},
    libraries=libraries,
    ext_modules=cythonize(
        extensions,
        build_dir="build/cython",
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "embedsignature": True},
    ),
)
