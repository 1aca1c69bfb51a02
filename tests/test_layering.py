"""The pure core (core, accelerators, scheduling, sim) imports neither ray nor torch.

Checked two ways: every module is imported in a fresh interpreter and ray/torch must not appear
in sys.modules; and no source file of the pure core names them in an import statement (which
also catches imports hidden inside functions).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "hetflow"
PURE = ["core", "accelerators", "scheduling", "sim"]
FORBIDDEN = {"ray", "torch"}
# Also pure: the controller's decisions, job files and records (the actor around them is not),
# and the device samplers and metric calculations (the agents around them are not):
# they are tested without Ray and must stay importable without it.
PURE_MODULES = ["hetflow.control.scheduler", "hetflow.control.jobspec", "hetflow.control.state",
                "hetflow.runtime.samplers", "hetflow.runtime.measures", "hetflow.runtime.resources"]


def _modules() -> list[str]:
    mods = []
    for layer in PURE:
        for path in sorted((PKG / layer).rglob("*.py")):
            rel = path.relative_to(PKG.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods.append(".".join(parts))
    return mods + PURE_MODULES


def test_pure_core_modules_do_not_load_ray_or_torch() -> None:
    mods = _modules()
    assert len(mods) > 5
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"pure core pulled in: {out.stdout.strip()}"


def test_pure_core_sources_name_no_forbidden_import() -> None:
    offenders = []
    for layer in PURE:
        for path in (PKG / layer).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                offenders += [f"{path}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []
