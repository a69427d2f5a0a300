"""The one reader of /proc/meminfo (the model's memory check, the memory plan, `colibri doctor`)."""

from __future__ import annotations


def meminfo() -> dict[str, int]:
    """Every /proc/meminfo entry: bytes for the `kB` ones, counts (HugePages_*) as they are;
    empty where the file cannot be read (not Linux)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def mem_available() -> int:
    """MemAvailable in bytes (0 when unknown)."""
    return meminfo().get("MemAvailable", 0)
