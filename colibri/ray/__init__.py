"""colibri on Ray Serve: replicas of one model behind one OpenAI-compatible endpoint.

Needs the ray extra (`pip install "colibri-moe[ray]"`: ray[serve], and the serve extra). The
parts: replica.py (one colibri.Engine per replica), ingress.py (colibri.serve's app in front,
on a remote engine), remote.py (that engine: one call per prompt, streamed, retried on
another replica when its replica died before answering), routing.py (prefix-aware routing,
the autoscaling policy), hub.py (the replicas' metrics for the ingress's /metrics), cli.py
(`colibri serve --ray`). The guide is docs/RAY.md.

For a Serve application of your own, after your own ray.init():

    from ray import serve
    import colibri.ray
    serve.run(colibri.ray.app("smollm2-135m-instruct", replicas=2, threads=1), route_prefix="/")
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from colibri.serve import REQUIRED as _SERVE_REQUIRED
from colibri.serve import missing_packages

REQUIRED = (("ray", "ray[serve]"), *_SERVE_REQUIRED)


def missing_extra() -> str | None:
    """None when Ray Serve and the serve stack are installed; else a message naming what is
    missing and the extra that installs it."""
    missing = missing_packages(REQUIRED) or missing_packages((("ray.serve", "ray[serve]"),))
    if not missing:
        return None
    from colibri._dist import install_hint

    return f"colibri on Ray needs {', '.join(missing)}: {install_hint('ray')}"


def _require() -> None:
    if (missing := missing_extra()) is not None:
        raise ImportError(missing)


def deployment(model: str | None = None, **kwargs: Any) -> Any:
    """The replica deployment bound to its model (a Ray Serve Application): pass it to the
    bind() of a deployment of your own, whose constructor receives its DeploymentHandle, and
    stream a colibri.ray.Job from it with handle.options(stream=True).generate.remote(job)
    (items: (i, Delta, Final | None), or one Refused). The arguments are _replicas'."""
    dep, init = _replicas(model, **kwargs)
    return dep.bind(**init)


def _replicas(model: str | None = None, *, replicas: int = 1,
               autoscale: tuple[int, int] | None = None, threads: int | None = None,
               replica_cpus: float | None = None, max_seqs: int = 16, max_queue: int = 256,
               model_id: str | None = None, engine_kwargs: dict[str, Any] | None = None,
               prefault: bool = True, grace_period: float = 30.0, hub: str | None = None,
               **model_kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """The replica deployment and its constructor's arguments: each replica one
    colibri.Engine on Model(model, threads=threads, **model_kwargs), at most max_seqs
    requests decoded together and max_queue waiting. A replica reserves replica_cpus CPUs
    (default: its thread count). replicas fixed, or autoscale=(min, max) on the replicas'
    reports (routing.autoscale). Requests are routed by prompt prefix (routing.PrefixRouter).
    Scaling down lets a replica's requests finish (grace_period seconds at most)."""
    _require()
    from ray import serve
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig

    from colibri.ray.replica import Replica

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cpus = float(replica_cpus if replica_cpus is not None else (threads or os.cpu_count() or 1))
    if cpus < 0:
        raise ValueError(f"replica_cpus must be >= 0, got {cpus}")
    mk = dict(model_kwargs, path=model, threads=threads, verbose=False)
    name = model_id or _model_id(model)
    router: dict[str, Any] = {"request_router_class": "colibri.ray.routing:PrefixRouter",
                              "request_routing_stats_period_s": 1.0}
    options: dict[str, Any] = dict(
        name="ColibriReplica", ray_actor_options={"num_cpus": cpus},
        max_ongoing_requests=max_seqs + max_queue,
        graceful_shutdown_timeout_s=max(1.0, grace_period), graceful_shutdown_wait_loop_s=0.5,
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        request_router_config=RequestRouterConfig(**router))
    if autoscale is not None:
        lo, hi = autoscale
        if not 0 < lo <= hi:
            raise ValueError(f"autoscale needs 0 < MIN <= MAX, got {lo}:{hi}")
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=lo, max_replicas=hi, initial_replicas=lo, metrics_interval_s=1.0,
            look_back_period_s=5.0, upscale_delay_s=2.0, downscale_delay_s=30.0,
            target_ongoing_requests=max_seqs,
            policy=AutoscalingPolicy(policy_function="colibri.ray.routing:autoscale"))
    else:
        options["num_replicas"] = replicas
    return serve.deployment(Replica, **options), dict(model_kwargs=mk, model_id=name, max_seqs=max_seqs,
                                 max_queue=max_queue, engine_kwargs=engine_kwargs,
                                 prefault=prefault, hub=hub)


def _model_id(model: str | None) -> str:
    if model is None:
        from colibri import hub

        return hub.CHAT_MODEL
    return os.path.basename(model) if os.path.exists(model) else model


def app(model: str | None = None, *, replicas: int = 1, autoscale: tuple[int, int] | None = None,
        threads: int | None = None, replica_cpus: float | None = None, max_seqs: int = 16,
        max_queue: int = 256, model_name: list[str] | str | None = None,
        api_key: str | None = None, max_body_bytes: int | None = None,
        accept_any_model_name: bool = False, allowed_origins: list[str] | None = None,
        grace_period: float = 30.0, engine_kwargs: dict[str, Any] | None = None,
        prefault: bool = True, hub: str | None = None, **model_kwargs: Any) -> Any:
    """A Serve application: the replicas (deployment(...)) behind an ingress serving the same
    OpenAI API as `colibri serve` (the same auth, limits, errors and streaming). Run it with
    serve.run(app, route_prefix="/"). model: a GGUF path or a model name (default: the chat
    model, as `colibri serve`); model_kwargs go to colibri.Model."""
    _require()
    from ray import serve

    from colibri.ray.ingress import Ingress
    from colibri.serve.state import DEFAULT_MAX_BODY

    names = [model_name] if isinstance(model_name, str) else list(model_name or [])
    model_id = names[0] if names else _model_id(model)
    hub = hub or f"colibri-hub-{uuid.uuid4().hex[:12]}"
    dep, init = _replicas(model, replicas=replicas, autoscale=autoscale, threads=threads,
                           replica_cpus=replica_cpus, max_seqs=max_seqs, max_queue=max_queue,
                           model_id=model_id, engine_kwargs=engine_kwargs, prefault=prefault,
                           grace_period=grace_period, hub=hub, **model_kwargs)
    n_max = autoscale[1] if autoscale is not None else replicas
    server = dict(model_id=model_id, aliases=names[1:], api_key=api_key,
                  max_body_bytes=max_body_bytes or DEFAULT_MAX_BODY,
                  accept_any_model=accept_any_model_name,
                  allowed_origins=list(allowed_origins or []), grace_period=grace_period,
                  # admission over every replica: each holds max_seqs + max_queue
                  max_seqs=max_seqs * n_max, max_queue=max_queue * n_max)
    ingress: Any = serve.deployment(serve.ingress()(Ingress), name="ColibriIngress",
                               ray_actor_options={"num_cpus": 0},
                               max_ongoing_requests=(max_seqs + max_queue) * n_max + 64,
                               graceful_shutdown_timeout_s=max(1.0, grace_period) + 5)
    front = dict(init["model_kwargs"])
    front.pop("threads", None)
    return ingress.bind(dep.bind(**init), front, hub, server)


from colibri.ray.replica import Final, Job, Refused  # noqa: E402  (no Ray import in them)

__all__ = ["Final", "Job", "Refused", "app", "deployment", "missing_extra"]
