"""Imported first by every benchmark that starts Ray: Ray's temp folder (``RAY_TMPDIR``) is a
folder of the benchmark's own, removed when it exits, so a run leaves nothing in Ray's shared
``/tmp/ray`` - no session folder, no ``ray_current_cluster`` naming a stopped cluster that the
next ``hetflow serve`` would try to join. Every process the benchmark starts inherits it. A
``RAY_TMPDIR`` set by the caller is kept (and left in place)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

if "RAY_TMPDIR" not in os.environ:
    HOME = tempfile.mkdtemp(prefix="hetflow-bench-ray-")
    os.environ["RAY_TMPDIR"] = HOME
    atexit.register(shutil.rmtree, HOME, ignore_errors=True)
else:
    HOME = os.environ["RAY_TMPDIR"]
