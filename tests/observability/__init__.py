"""Tests of metrics, ``hetflow top``, KubeRay manifests, the dashboard and object store sizing.

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first imported; without "0" a
local multi-node test cluster on 127.0.0.1 is rewritten to the host address and can hang. Some
modules here import ray at collection, so the variable is set before any of them.
"""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
