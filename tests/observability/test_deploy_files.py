"""The Dockerfiles: vendor PyTorch bases, and every file they copy is in the build context.

Docker cannot run where these tests run, so the images are not built here; this checks what can
be checked without a daemon: the base images, that each COPY source exists in the repository and
is not excluded by the Dockerfile's own .dockerignore, and that the build verifies the vendor's
torch build (CUDA or HIP).
"""

from __future__ import annotations

import fnmatch
import re

import pytest

from tests.conftest import REPO

DEPLOY = REPO / "deploy"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes (and its subtree)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        parts = path.split("/")
        hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat) or fnmatch.fnmatch("/".join(parts[:i]), pat.replace("**/", ""))
                  for i in range(1, len(parts) + 1))
        if hit:
            ignored = not negate
    return ignored


@pytest.mark.parametrize("flavour, base, check", [
    ("cuda", r"^nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3$", "torch.version.cuda"),
    ("rocm", r"^rocm/pytorch:rocm[\d.]+_ubuntu[\d.]+_py3\.(1[1-9])_pytorch_release_[\d.]+$", "torch.version.hip"),
])
def test_dockerfile_builds_on_the_vendor_pytorch_image(flavour, base, check) -> None:
    text = (DEPLOY / f"Dockerfile.{flavour}").read_text()
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert re.match(base, default), default
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert f"assert {check}" in text  # the build fails on a torch of the wrong vendor
    patterns = [l.strip() for l in (DEPLOY / f"Dockerfile.{flavour}.dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    sources = [s for line in re.findall(r"^COPY (.+)$", text, re.M) for s in line.split()[:-1]]
    assert "src" in sources and "pyproject.toml" in sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not _ignored(source, patterns), f"{source} is excluded from the build context"
    for path in ("src/hetflow/__init__.py", "src/hetflow/cli/main.py"):
        assert not _ignored(path, patterns), path
    for path in (".venv/bin/python", "runs/x", "src/hetflow/__pycache__/main.cpython-311.pyc"):
        assert _ignored(path, patterns), path
