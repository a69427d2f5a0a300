"""PyCUDA on a bare GPU machine: found if importable, else built offline from the sdist and
wheels carried in build/pycuda_wheels (tools/dev/fetch_pycuda.sh) against the CUDA toolkit
found there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from colibri.tools.cuda_check.reference import log


def find_cuda_root() -> Path | None:
    """The CUDA toolkit folder (with include/cuda.h): $CUDA_HOME, $CUDA_PATH, nvcc's folder
    (through wrapper scripts too), /usr/local/cuda."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
        try:  # a wrapper script such as `exec /usr/local/cuda-13.0/bin/nvcc "$@"`
            out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True,
                                 text=True, timeout=30).stdout
            cands += [str(Path(m).parent.parent) for m in
                      re.findall(r"(/\S+)/bin/nvcc", out)]
        except (OSError, subprocess.SubprocessError):
            pass
    cands.append("/usr/local/cuda")
    for c in cands:
        if c and (Path(c) / "include" / "cuda.h").is_file():
            return Path(c)
    return None


def find_libcuda_so1() -> str | None:
    """The driver library libcuda.so.1: from the loader cache (ldconfig -p), else in the
    folders of $LD_LIBRARY_PATH and the usual driver mounts (/usr/local/nvidia/lib64, ...),
    which containers often leave out of the cache."""
    found = re.findall(r"=>\s*(\S*libcuda\.so\.1)\b",
                       subprocess.run(["bash", "-c", "ldconfig -p 2>/dev/null"],
                                      capture_output=True, text=True).stdout)
    if found:
        return found[0]
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs += ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu",
             "/usr/lib64", "/usr/lib", "/usr/local/cuda/compat", "/usr/local/cuda/lib64"]
    for d in dirs:
        if (Path(d) / "libcuda.so.1").exists():
            return str(Path(d) / "libcuda.so.1")
    return None


def ensure_pycuda(root: Path) -> float | None:
    """Import PyCUDA, building it from build/pycuda_wheels when absent: its dependencies are
    installed from the carried wheels into build/pycuda_site, the sdist is unpacked into
    build/pycuda_src with a siteconf.py naming the toolkit found here, and compiled in place
    with `setup.py build_ext --inplace -j <cpus>` (parallel, unlike a pip build). Returns the
    build seconds (None when PyCUDA was already importable). root: the checkout (its build/)."""
    import tarfile

    site = root / "build" / "pycuda_site"
    src_root = root / "build" / "pycuda_src"
    for p in [site, *sorted(src_root.glob("pycuda-*"))]:
        if p.is_dir():
            sys.path.insert(0, str(p))
    try:
        import pycuda.driver  # noqa: F401

        return None
    except ImportError:
        pass
    wheels = root / "build" / "pycuda_wheels"
    sdists = sorted(wheels.glob("pycuda-*.tar.gz"))
    if not sdists:
        raise SystemExit(f"PyCUDA missing and no sdist in {wheels}: run tools/dev/fetch_pycuda.sh "
                         "and carry build/pycuda_wheels")
    cuda_root = find_cuda_root()
    if cuda_root is None:
        raise SystemExit("PyCUDA missing and no CUDA toolkit (include/cuda.h) found to build it")
    t0 = time.perf_counter()
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1")  # installs go to --target dirs
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-index", "--find-links", str(wheels), "--no-deps", "--target"]
    subprocess.run(pip + [str(site), "pytools", "platformdirs", "mako", "markupsafe",
                          "typing-extensions", "siphash24"], check=True, env=env)
    try:
        import setuptools  # noqa: F401
    except ImportError:  # the build backend, from the carried wheels, beside the build
        tools = root / "build" / "pycuda_buildenv"
        subprocess.run(pip + [str(tools), "setuptools", "wheel"], check=True, env=env)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tools), env.get("PYTHONPATH")]))
    src_root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdists[-1]) as tf:
        tf.extractall(src_root, filter="data")
    src = src_root / sdists[-1].name.removesuffix(".tar.gz")
    libdirs = [str(d) for d in (cuda_root / "lib64", cuda_root / "lib64" / "stubs",
                                cuda_root / "lib", cuda_root / "lib" / "stubs",
                                cuda_root / "targets" / "x86_64-linux" / "lib",
                                cuda_root / "targets" / "x86_64-linux" / "lib" / "stubs")
               if d.is_dir()]
    # The driver library: linkers look for libcuda.so, which some driver installs ship only
    # as libcuda.so.1; give them a link to it then.
    have_so = any((Path(d) / "libcuda.so").exists() for d in
                  libdirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"])
    if not have_so:
        found = find_libcuda_so1()
        if found:
            link_dir = root / "build" / "pycuda_libcuda"
            link_dir.mkdir(parents=True, exist_ok=True)
            link = link_dir / "libcuda.so"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(found)
            libdirs.append(str(link_dir))
    curand = (cuda_root / "include" / "curand.h").is_file()
    (src / "siteconf.py").write_text(
        f"CUDA_ROOT = {str(cuda_root)!r}\n"
        f"CUDA_INC_DIR = [{str(cuda_root / 'include')!r}]\n"
        f"CUDA_ENABLE_CURAND = {curand}\n"
        "CUDA_ENABLE_GL = False\n"
        "USE_SHIPPED_BOOST = True\n"
        f"CUDADRV_LIB_DIR = {libdirs!r}\n"
        "CUDADRV_LIBNAME = ['cuda']\n"
        f"CUDART_LIB_DIR = {libdirs!r}\n"
        "CUDART_LIBNAME = ['cudart']\n"
    )
    jobs = str(os.cpu_count() or 4)
    log(f"  building {src.name} with {jobs} jobs (CUDA_ROOT={cuda_root}, curand={curand})")
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "-j", jobs],
                       cwd=src, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"PyCUDA build failed:\n{(r.stdout + r.stderr)[-6000:]}")
    dt = time.perf_counter() - t0
    sys.path.insert(0, str(src))
    sys.path.insert(0, str(site))
    import importlib

    importlib.invalidate_caches()
    import pycuda.driver  # noqa: F401,F811

    return dt
