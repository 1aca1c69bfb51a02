"""What the three reference-protocol adapters share (``live_gavel``, ``live_sia``, ``live_fgd``):
a registry policy answering another simulator's mechanism, refused by name where that protocol
cannot express it, and each decision made as the controller makes it - the view built by the
caller (``rounds.build_round``), the policy's answer, the answer checked, the decision counted."""

from __future__ import annotations

from collections.abc import Mapping

from hetflow.core.errors import InputError
from hetflow.scheduling.policies.base import Policy
from hetflow.scheduling.policies.capacity import Assignment
from hetflow.scheduling.policies.rounds import RoundInputs, check_decision


class ProtocolAdapter:
    """Base of a protocol adapter: set :attr:`protocol` and :attr:`unexpressed` (registry
    policy -> why the protocol cannot run it)."""

    protocol = ""
    unexpressed: Mapping[str, str] = {}

    @classmethod
    def refuse(cls, name: str) -> None:
        """InputError (exit 2) when the protocol cannot run policy ``name``."""
        if name in cls.unexpressed:
            raise InputError(f"policy {name!r} cannot run on --protocol {cls.protocol}: "
                             f"{cls.unexpressed[name]}")

    def __init__(self, policy: Policy) -> None:
        self.refuse(policy.name)
        self.policy = policy
        self.name = policy.name
        self.decisions = 0

    def decide_on(self, inputs: RoundInputs) -> dict[str, Assignment]:
        """The policy's decision on ``inputs``, checked (a violation asserts: a policy bug)."""
        decision = self.policy.schedule(inputs.view)
        check_decision(decision, inputs)
        self.decisions += 1
        return dict(decision)


__all__ = ["ProtocolAdapter"]
