"""`colibri serve --ray`: what Ray adds to the server (the API itself is tested against both
`colibri serve` and `colibri serve --ray` by test_serve.py's parametrized suite).

A Ray cluster of the test's own (two replicas of the default text model at one thread each,
RAY_TMPDIR a directory of the test's: its processes are killed at the end even when the test
fails); the official openai client against the ingress. Prefix-aware routing, per-replica
metrics, a replica killed through Ray (its actor) while 8 streams run: the others complete,
the deployment restarts it and routes to it again. Plus, without a cluster: the remote
engine's retry and error paths on a fake deployment handle, the autoscaling arithmetic, and
the CLI's refusals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from serve_util import REPO, processes_using, start

pytestmark = pytest.mark.slow

MODEL = "gemma-3-270m-q4_k_m"
SYSTEM = ("You are a careful assistant for a library. You answer questions about opening "
          "hours, loans, renewals, fines, the reading rooms and the archive. You are brief and "
          "you never invent a rule that is not written here. Loans last three weeks; renewals "
          "are allowed twice; the archive opens on weekdays from nine to five.")


def per_replica(url: str, name: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^{re.escape(name)}{{replica="([^"]+)"}} (\S+)$', text, re.M)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    log = str(tmp_path_factory.mktemp("ray") / "server.log")
    srv = start(["-m", "gemma3-270m", "--model-name", MODEL, "--ray", "--replicas", "2",
                 "--threads", "1", "--ctx", "1024", "--max-seqs", "8"], log, timeout=300)
    # /health is ok once a replica serves; the command says "ready" once both do
    deadline = time.monotonic() + 180
    while " ready on " not in srv.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    while len(per_replica(srv.url, "colibri_requests_running")) < 2 and \
            time.monotonic() < deadline:  # and the hub has both reports
        time.sleep(0.2)
    yield srv
    code = srv.stop()
    assert srv.ray_tmp is not None
    left = processes_using(srv.ray_tmp)
    assert code == 0, srv.log()
    assert not left, f"Ray processes left running: {left}"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_two_replicas_each_with_its_metrics(server):
    running = per_replica(server.url, "colibri_requests_running")
    assert len(running) == 2 and all(n.startswith("SERVE_REPLICA::") for n in running)
    # the ingress's own HTTP counts, once, unlabelled by replica
    text = httpx.get(server.url + "/metrics").text
    assert re.search(r'^colibri_http_requests_total\{endpoint="/metrics",status="200"\} ',
                     text, re.M)


def test_a_repeated_system_prompt_goes_to_the_replica_that_holds_it(server, client):
    hits0 = per_replica(server.url, "colibri_prefix_cache_hits_total")
    cached = []
    for i, q in enumerate(["When does the archive open?", "How long is a loan?",
                           "Can I renew twice?", "Where is the reading room?"]):
        # an unrelated prompt in between: the router must not just repeat its last choice
        client.completions.create(model=MODEL, prompt=f"Unrelated text number {i}: " * 6,
                                  max_tokens=2, temperature=0)
        r = client.chat.completions.create(
            model=MODEL, max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
    # the first prefilled the system prompt; every later one reused it on the same replica
    assert cached[0] == 0 and all(c >= 48 for c in cached[1:]), cached
    hits = per_replica(server.url, "colibri_prefix_cache_hits_total")
    gained = {k: hits[k] - hits0.get(k, 0) for k in hits}
    assert sorted(gained.values())[-1] >= 3, gained  # one replica holds the prefix


def _streams(url: str, n: int, max_tokens: int, chunks: list[int] | None = None,
             staggered: bool = False) -> list[tuple[str, str | None]]:
    """n concurrent greedy streams: (text, None) or (text so far, the error it ended with).
    chunks[i] counts stream i's chunks as they come; staggered: stream i is sent once stream
    i-1 has streamed (each then sees the replicas' true load, so least-loaded spreads them)."""
    counts = chunks if chunks is not None else [0] * n

    async def run() -> list[tuple[str, str | None]]:
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                timeout=300)
        streaming = [asyncio.Event() for _ in range(n)]

        async def one(i: int) -> tuple[str, str | None]:
            parts: list[str] = []
            try:
                if staggered and i:
                    await streaming[i - 1].wait()
                async for c in await ac.completions.create(
                        model=MODEL, prompt=f"Story {i}: once upon a time, in a city of",
                        max_tokens=max_tokens, temperature=0, stream=True,
                        logit_bias={"1": -100, "106": -100}):
                    parts.append(c.choices[0].text)
                    counts[i] += 1
                    streaming[i].set()
            except openai.APIError as e:
                return "".join(parts), str(e)
            finally:
                streaming[i].set()
            return "".join(parts), None

        try:
            return list(await asyncio.gather(*(one(i) for i in range(n))))
        finally:
            await ac.close()

    return asyncio.run(run())


def test_a_killed_replica_fails_only_its_requests_and_comes_back(server):
    import ray

    alone = _streams(server.url, 8, 24)
    assert all(err is None for _, err in alone)
    before = per_replica(server.url, "colibri_requests_running")
    assert len(before) == 2

    os.environ["RAY_TMPDIR"] = server.ray_tmp  # join the server's cluster as a driver
    try:
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)

        async def kill_when_streaming() -> tuple[str, list[tuple[str, str | None]]]:
            chunks = [0] * 8
            task = asyncio.get_running_loop().run_in_executor(
                None, lambda: _streams(server.url, 8, 200, chunks, staggered=True))
            t0 = time.monotonic()
            run: dict[str, float] = {}
            # every stream has streamed (none can be retried elsewhere) and both replicas hold
            # some of them
            while time.monotonic() - t0 < 120 and not task.done():
                run = per_replica(server.url, "colibri_requests_running")
                if min(chunks) >= 2 and len(run) == 2 and all(v > 0 for v in run.values()):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail(f"the 8 streams never ran on both replicas: {chunks} {run}")
            victim = sorted(run)[0]
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)  # its actor
            return victim, await task

        victim, during = asyncio.run(kill_when_streaming())
    finally:
        ray.shutdown()
        del os.environ["RAY_TMPDIR"]
    failed = [err for _, err in during if err is not None]
    ok = [text for text, err in during if err is None]
    assert failed and ok, during  # the dead replica's streams failed, the other's finished
    assert all("replica" in e and "died" in e for e in failed), failed
    # greedy: what finished is what the same prompt gave before the kill (extended)
    assert all(any(t.startswith(a[0]) for a in alone) for t in ok)
    # Serve starts a new replica; the ingress routes to it once it reported
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = per_replica(server.url, "colibri_requests_running")
        if len(now) == 2 and victim not in now:
            break
        time.sleep(1)
    assert len(now) == 2 and victim not in now, now
    # both replicas serve again: rounds of the same streams (each as before the kill) until the
    # new replica has taken some (a loaded machine may route a whole round to the old one)
    for _ in range(5):
        after = _streams(server.url, 8, 24)
        assert after == alone
        tokens = per_replica(server.url, "colibri_generation_tokens_total")
        if all(v > 0 for v in tokens.values()):
            break
    assert all(v > 0 for v in tokens.values()), tokens


def test_the_cli_refuses_what_cannot_run():
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "colibri", "serve", "-m", "gemma3-270m",
                               *args], cwd=REPO, capture_output=True, text=True, timeout=120)

    r = serve("--replicas", "2")
    assert r.returncode != 0 and "need --ray" in r.stderr
    r = serve("--ray", "--autoscale", "3:1")
    assert r.returncode != 0 and "MIN <= MAX" in r.stderr
    r = serve("--ray", "--replicas", "2", "--autoscale", "1:2")
    assert r.returncode != 0 and "not allowed with" in r.stderr


def test_too_many_cpus_is_an_error_not_a_deployment_that_waits(tmp_path):
    import tempfile

    from serve_util import _kill_using

    tmp = tempfile.mkdtemp(prefix="cr", dir="/tmp")
    env = dict(os.environ, RAY_TMPDIR=tmp,
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        r = subprocess.run([sys.executable, "-m", "colibri", "serve", "-m", "gemma3-270m",
                            "--ray", "--replicas", "2", "--replica-cpus", "4096"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=180)
    finally:
        left = _kill_using(tmp)
    assert r.returncode != 0 and "need 8192 CPUs" in r.stderr, r.stderr[-2000:]
    assert not left, "the command left Ray processes running"


@contextlib.contextmanager
def own_cluster() -> Iterator[str]:
    """A Ray cluster of this process's own (2 CPUs, RAY_TMPDIR a new directory) with Serve's
    proxy on a free port: its URL. Torn down after, its processes killed even on failure."""
    import tempfile

    import ray
    from ray import serve
    from serve_util import _kill_using, free_port

    tmp = tempfile.mkdtemp(prefix="cr", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp
    port = free_port()
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            serve.shutdown()
            ray.shutdown()
        finally:
            del os.environ["RAY_TMPDIR"]
            _kill_using(tmp)


def test_scaling_down_lets_the_leaving_replica_finish_its_requests(tmp_path):
    """Two replicas, 4 long streams on them, then the application redeployed with one: every
    stream finishes, whole, on the replica it started on."""
    from ray import serve

    import colibri.ray

    def deploy(n: int) -> None:
        serve.run(colibri.ray.app("gemma3-270m", replicas=n, threads=1, ctx=1024,
                                  model_name=MODEL, hub="colibri-hub-scaling", max_seqs=4),
                  name="colibri", route_prefix="/", blocking=False)

    with own_cluster() as url:
        deploy(2)
        deadline = time.monotonic() + 120
        while len(per_replica(url, "colibri_requests_running")) < 2 and \
                time.monotonic() < deadline:
            time.sleep(0.2)

        async def run() -> list[tuple[str, str | None]]:
            task = asyncio.get_running_loop().run_in_executor(None, _streams, url, 4, 120)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:  # both replicas decoding
                run = per_replica(url, "colibri_requests_running")
                if len(run) == 2 and all(v > 0 for v in run.values()):
                    break
                await asyncio.sleep(0.2)
            await asyncio.get_running_loop().run_in_executor(None, deploy, 1)
            return await task

        out = asyncio.run(run())
        assert all(err is None for _, err in out), out
        with httpx.Client(timeout=60) as h:
            usage = [h.post(url + "/v1/completions", json={
                "model": MODEL, "prompt": f"Story {i}: once upon a time, in a city of",
                "max_tokens": 120, "temperature": 0,
                "logit_bias": {"1": -100, "106": -100}}).json()["choices"][0]["text"]
                for i in range(4)]
        assert [t for t, _ in out] == usage  # whole: what one replica gives alone
        deadline = time.monotonic() + 60
        while len(per_replica(url, "colibri_requests_running")) != 1 and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(per_replica(url, "colibri_requests_running")) == 1


def test_autoscaling_adds_a_replica_under_load(tmp_path):
    """--autoscale 1:2 with 2 requests per replica's batch: 8 long streams make the replica
    report a demand of 4 batches; Serve starts a second replica, and the next requests are
    spread over both (the least loaded first)."""
    from ray import serve

    import colibri.ray

    with own_cluster() as url:
        serve.run(colibri.ray.app("gemma3-270m", autoscale=(1, 2), threads=1, ctx=1024,
                                  model_name=MODEL, max_seqs=2),
                  name="colibri", route_prefix="/", blocking=False)
        assert len(per_replica(url, "colibri_requests_running")) == 1
        out = _streams(url, 8, 150)  # all queued at the one replica: it reports 4 batches
        assert all(err is None for _, err in out), out
        deadline = time.monotonic() + 120
        while len(per_replica(url, "colibri_requests_running")) < 2 and \
                time.monotonic() < deadline:
            time.sleep(0.5)
        before = per_replica(url, "colibri_generation_tokens_total")
        assert len(before) == 2, before  # scaled up
        assert all(err is None for _, err in _streams(url, 8, 30))
        after = per_replica(url, "colibri_generation_tokens_total")
        assert all(after[k] > before[k] for k in before), (before, after)  # both serve
