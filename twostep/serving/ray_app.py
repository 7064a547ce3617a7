"""Scale-out on Ray Serve: the HTTP app of `twostep.serving.http` as a Ray Serve ingress, one app per replica
(each replica batches its own requests, a BatchingTranslator per loaded model; Ray's proxy spreads requests over
replicas, and autoscaling adds replicas as their queues grow).

    twostep serve ART [ART ...] --ray [--replicas N | --autoscale MIN:MAX] [--num-cpus C] [--max-loaded M]
                  [--port 8000]
    serve run twostep.serving.ray_app:app_builder model_dir=ART[,ART...] [backend=ort-cpu] [replicas=2] [num_cpus=1]
              [max_loaded=M] [batching=static] [max_wait_ms=2] [express_tokens=11] [any other BatchLimits
              field=value] [api_key_file=KEYS] [api_key_db=DB] [protect_metrics=true] [graceful_shutdown_timeout_s=20]

The models a replica holds are Ray Serve's model multiplexing's (`replica_app`): the Catalog routes each request's
pair to a model (or two, through the pivot) as under uvicorn, and the replica's pool asks for that model by its
name through a `@serve.multiplexed(max_num_models_per_replica=M)` loader (all of them without --max-loaded). Ray
keeps each replica's models, least recently used first, unloads the one beyond M (awaiting the model's `__del__`:
the pool's `unload`, which closes it once its requests in flight are done) and tells its controller which models
each replica holds. So a request that names its model, in the `serve_multiplexed_model_id` header (the model's
name, as GET /v1/languages lists it) or with a handle's `.options(multiplexed_model_id=NAME)`, goes to a replica
that has it loaded, where Ray finds one; a request without it goes to any replica, which loads what it needs.

Every node of the cluster needs twostep installed and ART at the same path. Needs `pip install 'twostep[ray]'`.
API keys are read where the app is built and travel to the replicas as digests (ServeConfig); a keys database
(api_key_db=) is opened by each replica, at the same path. Each replica counts its clients' requests a minute
(--req-limit, a key's own) on its own. On shutdown Ray
Serve drains its replicas its own way (SHUTDOWN_KEYS): `twostep serve`'s --shutdown-delay is uvicorn's.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Optional

from twostep.errors import BackendUnavailable
from twostep.serving.http import ServeConfig, build_app, read_api_keys
from twostep.serving.limits import LIMIT_KEYS, BatchLimits
from twostep.serving.models import Loaded, Model, Pool


def import_serve():
    try:
        from ray import serve
    except ImportError as exc:
        raise BackendUnavailable(f"Ray Serve is not installed ({exc}); pip install 'twostep[ray]'") from None
    return serve


# Ray Serve's deployment options for a replica that stops: the seconds between its checks for requests still in
# flight (Ray's default 2), and the seconds it gets to answer them before it is killed (default 20).
SHUTDOWN_KEYS = ("graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s")


class Multiplexed:
    """A model as Ray Serve's multiplexing holds it: Ray awaits the object's `__del__` when it unloads the model
    (least recently used beyond max_num_models_per_replica, and when the replica stops). That `__del__` is an
    attribute of the instance, the pool's unload of the entry, so that garbage collection calls nothing."""

    def __init__(self, pool: Pool, entry: Loaded):
        self.entry = entry
        self.__del__ = functools.partial(pool.unload, entry)


class ToRayServe(logging.Handler):
    """Log records handed to Ray Serve's logger, whose handlers alone reach a replica's log and the driver."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("ray.serve").handle(record)


def replica_app(config: ServeConfig):
    """The app of one replica (built there: it holds locks and models, which do not pickle), whose pool loads and
    unloads its models through Ray Serve's model multiplexing, keyed by the model's name; at most
    config.max_loaded a replica (None: all). twostep's log lines go to Ray Serve's logger."""
    serve = import_serve()
    twostep_log = logging.getLogger("twostep")
    twostep_log.setLevel(logging.INFO)
    twostep_log.addHandler(ToRayServe())

    class Replica:
        def __init__(self):
            self.app = build_app(config, loader=self.load)

        @serve.multiplexed(max_num_models_per_replica=config.max_loaded or -1)
        async def multiplexed(self, model_id: str) -> Multiplexed:
            service = self.app.state.service
            return Multiplexed(service.pool, await service.pool.open(service.catalog.model(model_id)))

        async def load(self, model: Model) -> Loaded:  # the pool's loader
            return (await self.multiplexed(model.name)).entry

    return Replica().app


def deployment(config: ServeConfig, replicas: int = 1, num_cpus: float = 1.0,
               autoscaling: Optional[dict] = None, ray_actor_options: Optional[dict] = None,
               shutdown: Optional[dict] = None):
    """The bound Ray Serve application. `autoscaling` is Ray Serve's autoscaling_config (min_replicas,
    max_replicas, target_ongoing_requests, ...) and replaces the fixed `replicas`; `shutdown` holds
    SHUTDOWN_KEYS (Ray's defaults where absent)."""
    serve = import_serve()

    def asgi_app():  # Ray Serve calls it in each replica
        return replica_app(config)

    scaling: dict[str, Any] = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}
    actor = {"num_cpus": num_cpus, **(ray_actor_options or {})}
    replica = serve.deployment(name="twostep", ray_actor_options=actor, **scaling, **(shutdown or {}))(
        serve.ingress(asgi_app)())
    return replica.bind()


# app_builder's keys; then LIMIT_KEYS
DEPLOYMENT_KEYS = ("model_dir", "backend", "threads", "max_loaded", "replicas", "num_cpus", "api_key_file",
                   "api_key_db", "protect_metrics", *SHUTDOWN_KEYS)


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
    max_loaded = int(args["max_loaded"]) if "max_loaded" in args else None
    if max_loaded is not None and max_loaded < 1:
        raise ValueError(f"max_loaded= takes a number of models, 1 or more; got {max_loaded}")
    return ServeConfig(tuple(args["model_dir"].split(",")), args.get("backend"), threads,
                       BatchLimits.from_strings(limits), api_key_digests=read_api_keys(args.get("api_key_file")),
                       api_key_db=args.get("api_key_db"),
                       protect_metrics=args.get("protect_metrics") == "true", max_loaded=max_loaded)


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
