"""Cluster policies by name: a literal name -> factory map (no if/elif chain, no name tests
in the engine). ``make_policy("hetflow")`` builds one; ``placer=`` injects another placer."""

from __future__ import annotations

from typing import Callable

from hetflow.core.errors import InputError
from hetflow.scheduling.policies.base import Policy
from hetflow.scheduling.policies.bestfit import BestFitPolicy
from hetflow.scheduling.policies.fifo import FifoPolicy
from hetflow.scheduling.policies.hetflow import HetflowPolicy
from hetflow.scheduling.policies.las import LasPolicy
from hetflow.scheduling.policies.max_min_fairness import MaxMinFairnessPolicy
from hetflow.scheduling.policies.placer import Placer
from hetflow.scheduling.policies.srtf import SrtfPolicy

POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "bestfit": BestFitPolicy,
    "srtf": SrtfPolicy,
    "las": LasPolicy,
    "max_min_fairness": MaxMinFairnessPolicy,
    "hetflow": HetflowPolicy,
}

DEFAULT_POLICY = "hetflow"


def policy_names() -> tuple[str, ...]:
    return tuple(POLICIES)


def make_policy(name: str, placer: Placer | None = None) -> Policy:
    """A fresh policy instance (policies may memoise, so do not share one between runs)."""
    factory = POLICIES.get(name)
    if factory is None:
        raise InputError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return factory(placer=placer)


def parse_policy_list(text: str) -> list[str]:
    """``"fifo,max_min_fairness,hetflow"`` -> names, checked; duplicates are an error."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("--policies is empty; give names such as fifo,max_min_fairness,hetflow")
    for n in names:
        if n not in POLICIES:
            raise InputError(f"unknown policy {n!r} in --policies; choose from {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise InputError(f"--policies names a policy twice: {text!r}")
    return names
