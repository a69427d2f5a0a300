"""`colibri serve`: an OpenAI-compatible HTTP server on colibri.Engine.

Needs the serve extra (`pip install "colibri-moe[serve]"`: FastAPI, uvicorn, prometheus-client,
llguidance); importing colibri.serve.app without it fails, while this module only names what
is missing (missing_extra()). See colibri.serve.app for the routes and docs/SERVING.md.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

log = logging.getLogger("colibri")

REQUIRED = (("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("prometheus_client",
            "prometheus-client"), ("llguidance", "llguidance"), ("pydantic", "pydantic"))


def missing_packages(required: tuple[tuple[str, str], ...]) -> list[str]:
    """The distributions of required ((module, distribution), ...) whose module does not
    import."""
    missing = []
    for mod, dist in required:
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(dist)
    return missing


def missing_extra() -> str | None:
    """None when the serve stack is installed; else a message naming what is missing and the
    extra that installs it."""
    missing = missing_packages(REQUIRED)
    if not missing:
        return None
    from colibri._dist import install_hint

    return f"colibri serve needs {', '.join(missing)}: {install_hint('serve')}"


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (IPv6 when host has a colon); OSError when the address
    cannot be bound (in use, not an address of this machine, a name that does not resolve)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# seconds uvicorn gives the responses after the grace period's requests were cut off (their
# final error event, [DONE]) before it cancels what is left
CUT_OFF_SLACK = 5.0


def run(args: Any, load: Any) -> int:
    """Serve until SIGTERM/SIGINT (then: stop accepting, let running requests finish within
    args.grace_period seconds, cut off the ones still running then (a stream ends with an
    error event and [DONE], a JSON answer is a 503), close the engine); the exit status (0, or
    1 when the model failed to load or the address could not be bound: one line "colibri
    serve: error: could not listen on HOST:PORT: REASON"). load() returns the Model. The API
    key is args.api_key (the caller resolves --api-key, --api-key-file and COLIBRI_API_KEY);
    args.model_name the model's names (the id first, then aliases; empty: the file's name);
    args.allowed_origins the CORS origins (empty: no CORS)."""
    if (missing := missing_extra()) is not None:
        raise ValueError(missing)
    import uvicorn

    from colibri.serve.app import ServerState, create_app
    from colibri.serve.prefault import tune_malloc

    try:  # bound before anything else: nothing is announced or loaded for a bad address
        sock = _listen(args.host, args.port)
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        print(f"colibri serve: error: could not listen on {_hostport(args.host, args.port)}: "
              f"{reason}", file=sys.stderr, flush=True)
        return 1
    port = int(sock.getsockname()[1])  # --port 0: the one the system chose

    tune_malloc()  # before the model: every later block follows it

    names = args.model_name or []  # the id first, then the aliases
    names = [names] if isinstance(names, str) else list(names)
    model_id = names[0] if names else (os.path.basename(args.model) if args.model
                                       else "gemma-3-270m-q4_k_m")
    engine_kwargs: dict[str, Any] = {"prefix_cache": not args.no_prefix_cache}
    if args.prefill_chunk is not None:
        engine_kwargs["prefill_chunk"] = args.prefill_chunk
    state = ServerState(load, model_id, max_seqs=args.max_seqs, max_queue=args.max_queue,
                        api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                        engine_kwargs=engine_kwargs, prefault=not args.no_prefault,
                        grace_period=args.grace_period, aliases=names[1:],
                        accept_any_model=bool(getattr(args, "accept_any_model_name", False)),
                        allowed_origins=list(getattr(args, "allowed_origins", None) or []))
    app = create_app(state)
    config = uvicorn.Config(app, host=args.host, port=port, lifespan="on",
                            log_level="info" if args.verbose else "warning",
                            access_log=bool(args.verbose),
                            timeout_graceful_shutdown=args.grace_period + CUT_OFF_SLACK,
                            timeout_keep_alive=5)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not state.draining:
                print("colibri serve: shutting down: finishing running requests (at most "
                      f"{args.grace_period:g} s)", file=sys.stderr, flush=True)
                # at the end of the grace period the requests still running are cut off:
                # their streams end with an error event and [DONE]
                timer = threading.Timer(args.grace_period, state.cut_off)
                timer.daemon = True
                timer.start()
            state.draining = True  # new /v1/ requests on open connections: 503
            super().handle_exit(sig, frame)
            # uvicorn re-raises the signal after its graceful shutdown (the process then dies
            # of it); a SIGTERM that shut down cleanly exits 0 instead
            if sig == signal.SIGTERM:
                self._captured_signals = [s for s in self._captured_signals
                                          if s != signal.SIGTERM]

    server = Server(config)
    url = f"http://{_hostport(args.host, port)}"

    def ready() -> None:
        touched = ""
        if state.prefaulted:  # what --no-prefault would leave to the first requests
            p = dict(state.prefaulted)
            n = p.pop("forward_tokens", 0)
            touched = "; memory touched at start: " + ", ".join(
                f"{k.replace('_', ' ')} {v / 2**20:.0f} MiB" for k, v in p.items() if v) + \
                (f", a forward pass of {n} tokens" if n else "")
        also = (f" (also named {', '.join(state.aliases)})" if state.aliases else "") + \
            (" (any model name accepted)" if state.accept_any_model else "")
        print(f"colibri serve: {model_id}{also} ready on {url} (OpenAI API at {url}/v1)"
              f"{touched}",
              file=sys.stderr, flush=True)

    def fatal() -> None:
        server.should_exit = True

    state.on_ready = ready
    state.on_fatal = fatal
    print(f"colibri serve: loading the model; listening on {url}", file=sys.stderr, flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if state.load_error:
        print(f"colibri serve: error: the model failed to load: {state.load_error}",
              file=sys.stderr)
        return 1
    if not server.started:
        print(f"colibri serve: error: the server on {_hostport(args.host, port)} did not start",
              file=sys.stderr)
        return 1
    return 0


__all__ = ["missing_extra", "missing_packages", "run"]
