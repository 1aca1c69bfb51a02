"""Cluster policies (many jobs -> allocations), one module each, chosen by name.

See :mod:`hetflow.scheduling.policies.base` for the interface and
:mod:`hetflow.scheduling.policies.registry` for the names.
"""
