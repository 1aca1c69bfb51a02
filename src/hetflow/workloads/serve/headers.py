"""The headers the front door (HAProxy) sets for the servers behind it, and their reading.

Kept apart from the routers (front door, gateway, replicas) so that the protocol modules, which
they all dispatch to, can read them without importing a router.
"""

from __future__ import annotations

from typing import Any

from hetflow.workloads.serve.protocol import RequestError

PATH_HEADER = "x-hetflow-path"  # the path the client sent (HAProxy rewrites the path itself)
KEY_HEADER = "x-hetflow-key"  # the API key's name (never the key)
MODELS_HEADER = "x-hetflow-models"  # the models the key may use ("*": all)
TOKENS_HEADER = "x-hetflow-tokens"  # an answer's tokens, for the key's token limits
# with API keys on: a secret of the deployment that the front door adds to every request it
# sends to a replica or the gateway (and, as the Bearer token, to an LLM engine); a request
# reaching one of their ports without it did not pass the front door's keys and limits
FRONT_HEADER = "x-hetflow-front"
FRONT_TOKEN_ENV = "HETFLOW_FRONT_TOKEN"  # where HAProxy finds it (its environment, not its config)


def check_front(request: Any, token: str | None) -> None:
    """401 unless the request carries the deployment's front-door token (``token`` None: keys
    are off and every request is taken)."""
    if token is None:
        return
    import hmac

    got = request.headers.get(FRONT_HEADER, "")
    if not hmac.compare_digest(got.encode(errors="replace"), token.encode()):
        raise RequestError(401, "this port answers hetflow's front door only (API keys are on): "
                                "send the request to the front door's URL with your key")


def allowed_models(header: str | None) -> set[str] | None:
    """The gateway's reading of ``x-hetflow-models``: None = every model."""
    if header is None or header.strip() == "*":
        return None
    return {m for m in header.split(",") if m}


def check_allowed(request: Any, model: str) -> None:
    """403 when the request's API key may not use ``model`` (the front door sets the list and
    checks the model it read; this is the check on the model the gateway or a replica parsed)."""
    allowed = allowed_models(request.headers.get(MODELS_HEADER))
    if allowed is not None and model not in allowed:
        raise RequestError(403, "this API key may not use this model")


__all__ = ["FRONT_HEADER", "FRONT_TOKEN_ENV", "KEY_HEADER", "MODELS_HEADER", "PATH_HEADER", "TOKENS_HEADER",
           "allowed_models", "check_allowed", "check_front"]
