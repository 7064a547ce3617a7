"""Scale-out on Ray Serve: the HTTP app of `twostep.serving.http` as a Ray Serve ingress, one
BatchingTranslator per replica (each replica batches its own requests; Ray's proxy spreads requests over
replicas, and autoscaling adds replicas as their queues grow).

    twostep serve ART --ray [--replicas N | --autoscale MIN:MAX] [--num-cpus C] [--port 8000]
    serve run twostep.serving.ray_app:app_builder model_dir=ART[,ART...] [backend=ort-cpu] [replicas=2] [num_cpus=1]
              [batching=static] [max_wait_ms=2] [express_tokens=11] [any other BatchLimits field=value]
              [api_key_file=KEYS] [protect_metrics=true] [graceful_shutdown_timeout_s=20]

Every node of the cluster needs twostep installed and ART at the same path. Needs `pip install 'twostep[ray]'`.
API keys are read where the app is built and travel to the replicas as digests (ServeConfig). On shutdown Ray
Serve drains its replicas its own way (SHUTDOWN_KEYS): `twostep serve`'s --shutdown-delay is uvicorn's.
"""

from __future__ import annotations

from typing import Any, Optional

from twostep.errors import BackendUnavailable
from twostep.serving.http import ServeConfig, build_app, read_api_keys
from twostep.serving.limits import LIMIT_KEYS, BatchLimits


def import_serve():
    try:
        from ray import serve
    except ImportError as exc:
        raise BackendUnavailable(f"Ray Serve is not installed ({exc}); pip install 'twostep[ray]'") from None
    return serve


# Ray Serve's deployment options for a replica that stops: the seconds between its checks for requests still in
# flight (Ray's default 2), and the seconds it gets to answer them before it is killed (default 20).
SHUTDOWN_KEYS = ("graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s")


def deployment(config: ServeConfig, replicas: int = 1, num_cpus: float = 1.0,
               autoscaling: Optional[dict] = None, ray_actor_options: Optional[dict] = None,
               shutdown: Optional[dict] = None):
    """The bound Ray Serve application. `autoscaling` is Ray Serve's autoscaling_config (min_replicas,
    max_replicas, target_ongoing_requests, ...) and replaces the fixed `replicas`; `shutdown` holds
    SHUTDOWN_KEYS (Ray's defaults where absent)."""
    serve = import_serve()

    def asgi_app():  # built in each replica: the app holds locks and the model, which do not pickle
        return build_app(config)

    scaling: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    actor = {"num_cpus": num_cpus, **(ray_actor_options or {})}
    replica = serve.deployment(name="twostep", ray_actor_options=actor, **scaling, **(shutdown or {}))(
        serve.ingress(asgi_app)())
    return replica.bind()


# app_builder's keys; then LIMIT_KEYS
DEPLOYMENT_KEYS = ("model_dir", "backend", "threads", "replicas", "num_cpus", "api_key_file", "protect_metrics",
                   *SHUTDOWN_KEYS)


def app_builder(args: dict[str, str]):
    """For `serve run twostep.serving.ray_app:app_builder model_dir=... [key=value ...]`: the keys of
    DEPLOYMENT_KEYS, and the batching limits (BatchLimits.from_strings)."""
    shutdown = {key: float(args[key]) for key in SHUTDOWN_KEYS if key in args}
    return deployment(serve_config(args), replicas=int(args.get("replicas", 1)),
                      num_cpus=float(args.get("num_cpus", 1)), shutdown=shutdown)


def serve_config(args: dict[str, str]) -> ServeConfig:
    """What each replica opens, from app_builder's arguments; API keys from api_key_file= and TWOSTEP_API_KEYS,
    read here (read_api_keys)."""
    limits = {key: value for key, value in args.items() if key not in DEPLOYMENT_KEYS}
    if ("model_dir" not in args or not set(limits) <= set(LIMIT_KEYS)
            or args.get("protect_metrics", "false") not in ("true", "false")):
        raise ValueError(f"arguments: model_dir=ART and optionally {[*DEPLOYMENT_KEYS[1:], *LIMIT_KEYS]} "
                         f"(batching=inflight, the default, or static; protect_metrics=true or false); got {args}")
    threads = int(args["threads"]) if "threads" in args else None
    return ServeConfig(tuple(args["model_dir"].split(",")), args.get("backend"), threads,
                       BatchLimits.from_strings(limits), api_key_digests=read_api_keys(args.get("api_key_file")),
                       protect_metrics=args.get("protect_metrics") == "true")


def run(config: ServeConfig, host: str, port: int, replicas: int = 1, num_cpus: float = 1.0,
        autoscaling: Optional[dict] = None, address: Optional[str] = None, shutdown: Optional[dict] = None) -> None:
    """Start (or join, with `address`) a Ray cluster, serve on host:port until interrupted, then shut down
    (`shutdown`: SHUTDOWN_KEYS)."""
    import os
    import signal
    import threading

    if not address:
        # A local, single-node cluster: Ray's own processes then address each other on loopback (by default
        # they use the machine's network address, even when told 127.0.0.1). Read when ray is imported.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    serve = import_serve()
    if address:
        ray.init(address=address)
    else:
        ray.init(include_dashboard=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(config, replicas, num_cpus, autoscaling, shutdown=shutdown), name="twostep",
                  route_prefix="/")
        print(f"serving on http://{host}:{port} through Ray Serve", flush=True)
        stop.wait()
    finally:
        serve.shutdown()  # replicas finish their in-flight requests
        ray.shutdown()


__all__ = ["app_builder", "deployment", "run"]
