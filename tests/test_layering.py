"""The pure core (core, accelerators, scheduling, sim, capacity) imports neither ray nor torch.

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
PURE = ["core", "accelerators", "scheduling", "sim", "capacity"]
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


def import_graph() -> dict[str, set[str]]:
    """hetflow module -> the hetflow modules it imports anywhere (inside functions too: a cycle
    hidden in a function still ties the two modules together)."""
    modules = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path

    def owner(name: str) -> str | None:  # "hetflow.a.b.NAME" -> the module "hetflow.a.b"
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            graph[module] |= {t for name in targets if name.startswith("hetflow")
                              if (t := owner(name)) not in (None, module)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_hetflow() -> None:
    graph = import_graph()
    assert len(graph) > 100 and graph["hetflow.workloads.train.api"]  # the graph is read
    assert cycles(graph) == [], "import cycles (move the shared piece into a module of its own)"
