"""Scale-out on Ray Serve: the HTTP app of `twostep.serving.http` as a Ray Serve ingress, one
BatchingTranslator per replica (each replica batches its own requests; Ray's proxy spreads requests over
replicas, and autoscaling adds replicas as their queues grow).

    twostep serve ART --ray [--replicas N | --autoscale MIN:MAX] [--num-cpus C] [--port 8000]
    serve run twostep.serving.ray_app:app_builder model_dir=ART [backend=ort-cpu] [replicas=2] [num_cpus=1]
              [batching=static] [max_wait_ms=2] [express_tokens=11] [any other BatchLimits field=value]

Every node of the cluster needs twostep installed and ART at the same path. Needs `pip install 'twostep[ray]'`.
"""

from __future__ import annotations

from typing import Any, Optional

from twostep.errors import BackendUnavailable
from twostep.serving.http import ServeConfig, build_app
from twostep.serving.limits import LIMIT_KEYS, BatchLimits


def import_serve():
    try:
        from ray import serve
    except ImportError as exc:
        raise BackendUnavailable(f"Ray Serve is not installed ({exc}); pip install 'twostep[ray]'") from None
    return serve


def deployment(config: ServeConfig, replicas: int = 1, num_cpus: float = 1.0,
               autoscaling: Optional[dict] = None, ray_actor_options: Optional[dict] = None):
    """The bound Ray Serve application. `autoscaling` is Ray Serve's autoscaling_config (min_replicas,
    max_replicas, target_ongoing_requests, ...) and replaces the fixed `replicas`."""
    serve = import_serve()

    def asgi_app():  # built in each replica: the app holds locks and the model, which do not pickle
        return build_app(config)

    scaling: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    actor = {"num_cpus": num_cpus, **(ray_actor_options or {})}
    replica = serve.deployment(name="twostep", ray_actor_options=actor, **scaling)(serve.ingress(asgi_app)())
    return replica.bind()


DEPLOYMENT_KEYS = ("model_dir", "backend", "threads", "replicas", "num_cpus")  # app_builder's; then LIMIT_KEYS


def app_builder(args: dict[str, str]):
    """For `serve run twostep.serving.ray_app:app_builder model_dir=... [key=value ...]`: the keys of
    DEPLOYMENT_KEYS, and the batching limits (BatchLimits.from_strings)."""
    limits = {key: value for key, value in args.items() if key not in DEPLOYMENT_KEYS}
    if "model_dir" not in args or not set(limits) <= set(LIMIT_KEYS):
        raise ValueError(f"arguments: model_dir=ART and optionally {[*DEPLOYMENT_KEYS[1:], *LIMIT_KEYS]} "
                         f"(batching=inflight, the default, or static); got {args}")
    config = ServeConfig(args["model_dir"], args.get("backend"), int(args["threads"]) if "threads" in args else None,
                         BatchLimits.from_strings(limits))
    return deployment(config, replicas=int(args.get("replicas", 1)), num_cpus=float(args.get("num_cpus", 1)))


def run(config: ServeConfig, host: str, port: int, replicas: int = 1, num_cpus: float = 1.0,
        autoscaling: Optional[dict] = None, address: Optional[str] = None) -> None:
    """Start (or join, with `address`) a Ray cluster, serve on host:port until interrupted, then shut down."""
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
        serve.run(deployment(config, replicas, num_cpus, autoscaling), name="twostep", route_prefix="/")
        print(f"serving on http://{host}:{port} through Ray Serve", flush=True)
        stop.wait()
    finally:
        serve.shutdown()  # replicas finish their in-flight requests
        ray.shutdown()


__all__ = ["app_builder", "deployment", "run"]
