"""Ray Serve's own tooling for a hetflow serving config: an application builder and Serve
config files (``serve run``, ``serve deploy``, ``serve status``, KubeRay's RayService).

    serve run hetflow.serve:app config=examples/serve_digits.yaml
    hetflow serve examples/serve_digits.yaml --serve-config > serve.yaml
    serve deploy serve.yaml            # or: serve run serve.yaml
    hetflow k8s render --cluster examples/cluster.yaml --serve examples/serve_digits.yaml

:func:`app` is a Serve *application builder* (a function of one ``args`` dict that returns an
Application). Its args: ``config`` (a serving YAML's path, on the machine that builds) or
``serving`` (the serving config inline, as a mapping: what :func:`serve_config_document`
writes, so the Serve config file is self-contained and builds anywhere on the cluster), and
``address`` (the Ray cluster, only for ``serve run IMPORT_PATH``, whose builder runs before
Serve connects; by default the builder takes ``serve run``'s own ``--address``, then
``RAY_ADDRESS``, then ``auto``). The application is one Serve application named after the config: the
gateway is its ingress and holds the model deployments' handles, placed by hetflow's planner
like ``hetflow serve``'s, with the same endpoints, protocols, batching, fallback and health.

What differs from ``hetflow serve``: there is no HAProxy front door, so every request takes
Serve's proxy -> gateway -> model replica (Serve's speed, not hetflow's fast path; with
``RAY_SERVE_ENABLE_HA_PROXY=1`` Serve's own HAProxy replaces its Python proxy), ``/metrics``
counts per gateway replica, and the builder never trains: a model's checkpoint must exist.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError

IMPORT_PATH = "hetflow.serve:app"
ARGS = ("config", "serving", "address")


def config_from_args(args: Any) -> Any:
    """The :class:`ServeConfig` a builder's args name (InputError for anything else)."""
    from hetflow.workloads.serve.config import load_serve_config, serve_config_from_dict

    if not isinstance(args, dict):
        raise InputError(f"{IMPORT_PATH}: expected args config=PATH or serving={{...}}, got "
                         f"{type(args).__name__}")
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        raise InputError(f"{IMPORT_PATH}: unknown argument(s) {', '.join(unknown)}; it takes "
                         "config=PATH (a serving YAML) or serving (the config inline), and "
                         "optionally address")
    if ("config" in args) == ("serving" in args):
        raise InputError(f"{IMPORT_PATH}: give exactly one of config=PATH (a serving YAML) or "
                         "serving (the config inline, as `hetflow serve CONFIG --serve-config` "
                         "writes it)")
    if "config" in args:
        return load_serve_config(str(args["config"]))
    return serve_config_from_dict(args["serving"], source=f"{IMPORT_PATH} args.serving")


def app(args: dict[str, Any]) -> Any:
    """Serve application builder (see the module docstring)."""
    import ray

    from hetflow.workloads.serve.app import build_single_application, plan_models

    config = config_from_args(args)
    check_tooling_auth(config)
    if not ray.is_initialized():  # `serve run IMPORT_PATH` builds before it connects
        ray.init(address=args.get("address") or config.ray_address or _serve_run_address()
                 or os.environ.get("RAY_ADDRESS") or "auto", namespace="serve")
    return build_single_application(config, plan_models(config, may_train=False))


def check_tooling_auth(config: Any) -> None:
    """Serve's own tooling path (``serve run``/``serve deploy``, a RayService) has no front
    door, so no API key would be checked there: an explicit ``auth.mode: keys`` is refused
    (``auto`` means none on that path; docs/serving.md, Gateway)."""
    if config.auth.mode == "keys":
        raise InputError("auth.mode keys needs hetflow's front door (hetflow serve): Serve's own "
                         "tooling path (serve run / serve deploy / a RayService) has none, so no key "
                         "would be checked; use hetflow serve, or auth: {mode: none} behind a gateway "
                         "of your own")
    if config.upstreams:
        raise InputError("upstreams are routed by hetflow's front door (hetflow serve): Serve's own "
                         "tooling path (serve run / serve deploy / a RayService) has none; use "
                         "hetflow serve, or drop upstreams (and fallbacks naming them)")


def _serve_run_address() -> str | None:
    """The ``--address`` given to ``serve run`` when this builder runs inside it (Serve's CLI
    builds the application before it connects, and then keeps whatever Ray the builder
    joined): without it, ``auto`` would join the newest cluster on this machine, not the one
    named by ``-a``."""
    try:
        import click
    except ImportError:  # pragma: no cover - Serve's CLI needs click
        return None
    context = click.get_current_context(silent=True)
    address = context.params.get("address") if context is not None else None
    return address if isinstance(address, str) and address and address != "auto" else None


def self_contained(config: Any) -> dict[str, Any]:
    """``config`` as a mapping that builds anywhere: each model's training config inline
    (not a file path), its checkpoint directory absolute, no ``ray_address`` (Serve's tooling
    picks the cluster). Model files (TorchScript, torch.export, safetensors) stay paths: they
    must exist at that path where the replicas run."""
    from hetflow.workloads.serve.inference import train_config_of

    data = config.model_dump(mode="json", exclude_unset=True)
    data.pop("ray_address", None)
    models = []
    for entry, raw in zip(config.models, data["models"]):
        raw = dict(raw)
        train = train_config_of(entry)
        if train is not None:
            raw.pop("train_config", None)
            raw["train"] = train.model_dump(mode="json")
            if entry.weights != "random" and not entry.safetensors:
                raw["checkpoint_dir"] = str(Path(entry.checkpoint_dir).absolute()
                                            if entry.checkpoint_dir else train.checkpoint_dir)
        models.append(raw)
    data["models"] = models
    return data


def serve_config_document(config: Any, host: str | None = None,
                          port: int | None = None) -> dict[str, Any]:
    """A Serve config file (``serve deploy`` / ``serve run`` / a RayService's
    ``serveConfigV2``) that deploys ``config`` through :func:`app`."""
    from hetflow.workloads.serve.config import is_loopback

    host = host or config.http.host
    return {
        "proxy_location": "HeadOnly" if is_loopback(host) else "EveryNode",
        "http_options": {"host": host, "port": port or config.http.port},
        "applications": [{
            "name": config.name,
            "route_prefix": config.http.route_prefix,
            "import_path": IMPORT_PATH,
            "args": {"serving": self_contained(config)},
        }],
    }


__all__ = ["ARGS", "IMPORT_PATH", "app", "config_from_args", "self_contained",
           "serve_config_document"]
