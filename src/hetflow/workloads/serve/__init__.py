"""Serving trained models on Ray Serve: ``hetflow serve CONFIG.yaml`` (see docs/serving.md).

Modules: ``config`` (the YAML), ``protocol`` (request format and checks), ``inference``
(weights, precision, device; no Ray), ``placement`` (planner -> one deployment per device),
``app`` (the Serve deployments and ``deploy``), ``metrics``, ``loadgen`` (open-loop load
generator). Import ``app`` only where Ray is wanted; the others do not import it.
"""
