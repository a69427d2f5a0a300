"""`colibri doctor`: what this machine offers colibri, and what to do about what is missing.

Every probe reads /proc, /sys or the environment; none needs root and none can fail the command.
"""

from __future__ import annotations

import os
import platform
import resource
import shutil
import subprocess
from dataclasses import dataclass

from colibri._dist import install_hint
from colibri.meminfo import meminfo


@dataclass
class Finding:
    name: str
    value: str
    ok: bool = True
    advice: str = ""


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def findings() -> list[Finding]:
    import colibri._core._status as _status
    from colibri import simd

    res: list[Finding] = []
    res.append(Finding("cpu", f"{_cpu_model()} ({os.cpu_count()} logical cores)"))
    det, lvl = simd.detected(), simd.level()
    build = "portable (COLIBRI_PORTABLE=1)" if _status.build_portable() else "native (-march=native)"
    res.append(
        Finding(
            "simd",
            f"kernels use {lvl} (CPU supports {det}); build {build}",
            ok=det != "scalar",
            advice="" if det != "scalar" else "no AVX2: kernels run the scalar path, expect low speed",
        )
    )
    mem = meminfo()
    if mem:
        res.append(
            Finding(
                "memory",
                f"{_fmt_bytes(mem.get('MemAvailable', 0))} available of {_fmt_bytes(mem.get('MemTotal', 0))}",
            )
        )
    total = mem.get("HugePages_Total", 0)
    free = mem.get("HugePages_Free", 0)
    size = mem.get("Hugepagesize", 2 * 1024 * 1024)
    res.append(
        Finding(
            "huge pages",
            f"HugePages_Total={total} HugePages_Free={free} (page size {_fmt_bytes(size)})",
            ok=free > 0,
            advice=""
            if free > 0
            else "the KV arena falls back to transparent huge pages or plain pages; to reserve "
            "2 MiB pages (as root): sudo sysctl -w vm.nr_hugepages=512",
        )
    )
    thp_raw = _read("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = "unavailable"
    if thp_raw:
        for word in thp_raw.split():
            if word.startswith("["):
                thp = word.strip("[]")
    res.append(
        Finding(
            "transparent huge pages",
            thp,
            ok=thp in ("always", "madvise"),
            advice=""
            if thp in ("always", "madvise")
            else "enable with: echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled",
        )
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY

    def lim(v: int) -> str:
        return "unlimited" if v == inf else _fmt_bytes(v)

    ok_lock = soft == inf or soft >= 1 << 30
    res.append(
        Finding(
            "mlock limit",
            f"soft {lim(soft)}, hard {lim(hard)}",
            ok=ok_lock,
            advice=""
            if ok_lock
            else "lock=True needs RLIMIT_MEMLOCK above the arena size: `ulimit -l unlimited` "
            "(or memlock in /etc/security/limits.conf)",
        )
    )
    nvcc = shutil.which("nvcc")
    nvcc_ver = ""
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=20)
            lines = [x for x in out.stdout.splitlines() if "release" in x]
            nvcc_ver = lines[0].strip() if lines else "present"
        except (OSError, subprocess.SubprocessError):
            nvcc_ver = "present (did not answer)"
    res.append(
        Finding(
            "nvcc",
            f"{nvcc} ({nvcc_ver})" if nvcc else "not found",
            ok=bool(nvcc),
            advice="" if nvcc else "install the CUDA toolkit to run MoE layers on an NVIDIA GPU",
        )
    )
    try:
        import pycuda  # type: ignore[import-not-found]  # noqa: F401

        pycuda_ok, pycuda_msg = True, f"pycuda {getattr(pycuda, 'VERSION_TEXT', '')}".strip()
    except Exception as e:  # pragma: no cover - depends on the machine
        pycuda_ok, pycuda_msg = False, f"not importable ({type(e).__name__})"
    res.append(
        Finding(
            "pycuda",
            pycuda_msg,
            ok=pycuda_ok,
            advice="" if pycuda_ok else f"{install_hint('cuda')} (needs the CUDA toolkit and driver)",
        )
    )
    dev_msg, dev_ok = "none", False
    if pycuda_ok:
        try:
            import pycuda.driver as drv  # type: ignore[import-not-found]

            drv.init()
            n = drv.Device.count()
            if n:
                d = drv.Device(0)
                cc = d.compute_capability()
                dev_msg, dev_ok = f"{n} device(s); 0: {d.name()} sm_{cc[0]}{cc[1]}", True
        except Exception as e:  # pragma: no cover - depends on the machine
            dev_msg = f"none ({e})"
    elif os.path.exists("/proc/driver/nvidia/version"):
        dev_msg = "NVIDIA driver present, but PyCUDA is missing"
    res.append(
        Finding(
            "cuda device",
            dev_msg,
            ok=dev_ok,
            advice="" if dev_ok else "colibri runs on the CPU; a GPU is optional",
        )
    )
    return res


def settings_findings() -> list[Finding]:
    """One finding per COLIBRI_* variable that is set (colibri.config), a bad value marked with
    its error."""
    from colibri import config

    res = []
    for var, raw, shown in config.settings():
        if raw is None:
            continue
        bad = shown.startswith("error:")
        res.append(Finding(var.name, f"{raw!r} -> {shown}" if not bad else raw, ok=not bad,
                           advice=shown[len("error: "):] if bad else ""))
    return res


def report() -> list[str]:
    """The lines `colibri doctor` prints."""
    from colibri import __version__

    lines = [f"colibri {__version__} doctor"]
    for f in findings() + settings_findings():
        mark = "ok " if f.ok else "-- "
        lines.append(f"{mark}{f.name:24s} {f.value}")
        if f.advice:
            lines.append(f"   {'':24s} -> {f.advice}")
    return lines
