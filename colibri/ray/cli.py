"""`colibri serve --ray`: start a Ray cluster on this machine (or join the one at
--ray-address), deploy colibri.ray.app on Ray Serve, serve until SIGTERM/SIGINT, then let
the requests in flight finish (--grace-period) and tear down what it started."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any

APP = "colibri"


def _autoscale(spec: str | None) -> tuple[int, int] | None:
    if spec is None:
        return None
    try:
        lo, hi = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"--autoscale takes MIN:MAX (two integers), got {spec!r}") from None
    if not 0 < lo <= hi:
        raise ValueError(f"--autoscale needs 0 < MIN <= MAX, got {spec!r}")
    return lo, hi


def run(args: Any, model_kwargs: dict[str, Any]) -> int:
    """Serve args.model on Ray (the arguments of `colibri serve`, with --replicas,
    --autoscale, --ray-address, --replica-cpus); the exit status."""
    from colibri.ray import missing_extra

    if (missing := missing_extra()) is not None:
        raise ValueError(missing)
    from colibri.serve import _hostport, _listen

    autoscale = _autoscale(args.autoscale)
    replicas = args.replicas if args.replicas is not None else 1
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    threads = args.threads or os.cpu_count() or 1
    cpus = args.replica_cpus if args.replica_cpus is not None else float(threads)
    if cpus < 0:
        raise ValueError(f"--replica-cpus must be >= 0, got {cpus}")
    try:  # the address checked now (Ray's proxy would fail later, in its own process)
        with _listen(args.host, args.port) as sock:
            port = int(sock.getsockname()[1])  # --port 0: the one the system chose
    except OSError as e:
        print(f"colibri serve: error: could not listen on {_hostport(args.host, args.port)}: "
              f"{e.strerror or e}", file=sys.stderr, flush=True)
        return 1

    import ray
    from ray import serve

    import colibri.ray as cray
    from colibri.ray.hub import NAMESPACE

    hub = f"colibri-hub-{uuid.uuid4().hex[:12]}"

    started = args.ray_address is None
    print("colibri serve: " + ("starting a Ray cluster on this machine" if started else
                               f"joining the Ray cluster at {args.ray_address}"),
          file=sys.stderr, flush=True)
    if started:  # this machine only: Ray's own services on the loopback address
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=bool(args.verbose), logging_level=logging.WARNING)
    else:
        ray.init(address=args.ray_address, log_to_driver=bool(args.verbose),
                 logging_level=logging.WARNING)
    try:
        have = float(ray.cluster_resources().get("CPU", 0))
        need = cpus * (autoscale[0] if autoscale else replicas)
        if need > have:
            raise ValueError(f"{autoscale[0] if autoscale else replicas} replica(s) of "
                             f"{cpus:g} CPUs need {need:g} CPUs; the Ray cluster has {have:g} "
                             "(fewer --replicas, --threads or --replica-cpus)")
        serve.start(http_options={"host": args.host, "port": port})
        app = cray.app(args.model, hub=hub, replicas=replicas, autoscale=autoscale, threads=threads,
                       replica_cpus=cpus, max_seqs=args.max_seqs, max_queue=args.max_queue,
                       model_name=args.model_name, api_key=args.api_key,
                       max_body_bytes=args.max_body_bytes,
                       accept_any_model_name=bool(args.accept_any_model_name),
                       allowed_origins=args.allowed_origins, grace_period=args.grace_period,
                       engine_kwargs={"prefix_cache": not args.no_prefix_cache,
                                      **({"prefill_chunk": args.prefill_chunk}
                                         if args.prefill_chunk is not None else {})},
                       prefault=not args.no_prefault, **model_kwargs)
        url = f"http://{_hostport(args.host, port)}"
        print(f"colibri serve: deploying on Ray; listening on {url}", file=sys.stderr,
              flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        t0 = time.perf_counter()
        try:
            serve.run(app, name=APP, route_prefix="/", blocking=False)
        except RuntimeError as e:  # a replica that cannot load its model: Serve gave up
            print(f"colibri serve: error: the deployment failed: {e}", file=sys.stderr,
                  flush=True)
            return 1
        n = f"{autoscale[0]}-{autoscale[1]}" if autoscale else str(replicas)
        print(f"colibri serve: {args.model_name[0] if args.model_name else args.model} ready "
              f"on {url} (OpenAI API at {url}/v1): {n} replica(s) of {threads} thread(s) on "
              f"Ray, deployed in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        stop.wait()
        print("colibri serve: shutting down: finishing running requests (at most "
              f"{args.grace_period:g} s)", file=sys.stderr, flush=True)
        return 0
    finally:
        try:
            if serve.status().applications.get(APP) is not None:
                serve.delete(APP)  # the replicas drain (graceful_shutdown_timeout_s)
            if started:
                serve.shutdown()
            else:  # a cluster of others: only what this command made goes
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(hub, namespace=NAMESPACE))
        finally:
            ray.shutdown()
