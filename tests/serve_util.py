"""Starting `colibri serve` as a subprocess on a free port, for the serve tests."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    log_path: str
    seen_loading: list[dict] = field(default_factory=list)  # 503 bodies seen while loading
    ray_tmp: str | None = None  # --ray: the Ray cluster's directory (RAY_TMPDIR)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.ray_tmp is not None:  # a Ray process the server left (it was killed): gone
            _kill_using(self.ray_tmp)
        return int(self.proc.returncode)


def processes_using(path: str) -> list[int]:
    """The processes (but this one) whose command line names path (a Ray cluster's directory)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _kill_using(path: str) -> list[int]:
    """SIGKILL every process whose command line names path; those it killed."""
    killed = []
    for pid in processes_using(path):
        try:
            os.kill(pid, 9)
            killed.append(pid)
        except OSError:
            pass
    return killed


def start(args: list[str], log_path: str, api_key: str | None = None,
          timeout: float = 180.0) -> Server:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ray_tmp = None
    if "--ray" in args:  # a Ray cluster of its own, in a directory of its own (short: sockets)
        import tempfile

        ray_tmp = env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="cr", dir="/tmp")
    logf = open(log_path, "w")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen([sys.executable, "-m", "colibri", "serve", "--port", str(port), *args],
                            cwd=REPO, env=env, stdout=logf, stderr=subprocess.STDOUT, text=True)
    logf.close()
    srv = Server(proc, f"http://127.0.0.1:{port}", log_path, ray_tmp=ray_tmp)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"colibri serve exited {proc.returncode}:\n{srv.log()}")
        try:
            r = httpx.get(srv.url + "/health", timeout=5)
            if r.status_code == 200:
                return srv
            m = httpx.get(srv.url + "/v1/models", headers=headers, timeout=5)
            if m.status_code == 503 and m.headers.get("content-type") == "application/json":
                srv.seen_loading.append({"health": r.json(), "models": m.json()})
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    srv.stop()
    raise RuntimeError(f"colibri serve did not become ready in {timeout} s:\n{srv.log()}")


def metric(url: str, name: str) -> float | None:
    """The value of a metric in /metrics, summed over its replicas (colibri serve --ray labels
    each replica's series with replica="NAME"; None if absent)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    vals = re.findall(rf'^{re.escape(name)}(?: |{{replica="[^"]*"}} )(\S+)$', text, re.M)
    return sum(float(v) for v in vals) if vals else None


def stream_lines(url: str, body: dict, out: dict, started: threading.Event,
                 path: str = "/v1/completions") -> None:
    """POST body as a stream (for a thread): out gets status and the SSE lines (or exc);
    started is set at the first line."""
    lines: list[str] = []
    try:
        with httpx.stream("POST", url + path, json=body, timeout=180) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["exc"] = repr(e)
    finally:
        started.set()
        out["lines"] = lines


def post_json(url: str, body: dict, out: dict, path: str = "/v1/completions") -> None:
    """POST body (for a thread): out gets status and the JSON body (or exc)."""
    try:
        r = httpx.post(url + path, json=body, timeout=180)
        out["status"], out["body"] = r.status_code, r.json()
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["exc"] = repr(e)
