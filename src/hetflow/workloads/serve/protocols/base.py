"""A serving protocol's declaration: its routes (:class:`Route`) and :class:`Protocol`.

Imported by the protocol modules; the table of all of them and the routing by it are in
:mod:`hetflow.workloads.serve.protocols`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

Handler = Callable[[Any, Any, str, Mapping[str, str]], Awaitable[Any]]  # (host, request, path, params)


@dataclass(frozen=True)
class Route:
    """One endpoint: ``method`` on ``path`` (a template), answered by ``gateway`` (every route)
    and, for a model's own requests, by ``replica`` too.

    ``model_in_body``: the model is the JSON body's ``"model"`` (the front door reads it to
    route); ``probe``: a health check, open without an API key."""

    method: str
    path: str
    gateway: Handler
    replica: Handler | None = None
    model_in_body: bool = False
    probe: bool = False

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("/")[1:])

    @property
    def greedy(self) -> bool:
        return self.path.endswith("*}")

    def params(self, path: str) -> dict[str, str] | None:
        """The template's parameters in ``path``, or None when it does not match."""
        parts = path.split("/")[1:]
        want = self.segments
        if self.greedy:
            if len(parts) < len(want):
                return None
        elif len(parts) != len(want):
            return None
        out: dict[str, str] = {}
        for i, seg in enumerate(want):
            if seg.startswith("{") and seg.endswith("}"):
                if seg.endswith("*}"):
                    rest = "/".join(parts[i:])
                    if not rest:
                        return None
                    out[seg[1:-2]] = rest
                    return out
                if not parts[i]:
                    return None
                out[seg[1:-1]] = parts[i]
            elif parts[i] != seg:
                return None
        return out


@dataclass(frozen=True)
class Protocol:
    """A protocol's routes, its error body (``error_body(message, param) -> bytes``), the path
    prefix it owns (its 404 hint answers an unknown path under it) and that hint."""

    name: str
    routes: tuple[Route, ...]
    error_body: Callable[..., bytes]
    prefix: str | None = None
    hint: str = ""


@dataclass(frozen=True)
class Match:
    protocol: Protocol
    route: Route
    params: Mapping[str, str]


__all__ = ["Handler", "Match", "Protocol", "Route"]
