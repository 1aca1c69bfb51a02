"""Network helpers for the tests: servers they start listen on loopback only."""

from __future__ import annotations

import itertools
import os
import socket

# Ports the tests hand to servers come from 20000-29999, below the kernel's ephemeral range
# (32768-60999 here), where Ray's processes, Serve's direct-ingress replicas (30000 up) and every
# bind(0) pick theirs; each pytest-xdist process has its own slice. A port picked by the kernel
# and released could be taken by another test process's Ray before the test binds it.
_BASE, _SLICE = 20000, 2500


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    start = _BASE + (index % 4) * _SLICE
    return range(start, start + _SLICE)


_candidates = itertools.cycle(_slice())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, from this test process's own slice."""
    for _ in range(_SLICE):
        port = next(_candidates)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this test process's slice")
