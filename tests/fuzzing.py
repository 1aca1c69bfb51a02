"""Property-based fuzzing of hetflow's input boundaries (HTTP bodies, job files, cluster files).

Hypothesis draws the inputs: random JSON trees, valid documents with a few parts broken
(:func:`mutated`), and raw bytes. :func:`fuzz` runs a check on each drawn input, repeatably
(``derandomize``: the same inputs in every run, so CI is stable) and returns how many inputs
it tried, which the tests print::

    tried = fuzz(check, mutated(GOOD), examples=200)
    report(capsys, f"fuzz: {tried} inputs to /v1/models/m/predict, every answer 4xx or 200")
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st

# Numbers a parser must survive: huge whole numbers (beyond float64 and int64), NaN and the
# infinities, negative zero, the edges of float32.
NUMBERS = [0, -1, 1, 2**31, 2**63, -(2**63) - 1, 2**64, 10**400, -(10**400), 1e308, -1e308,
           5e-324, 3.5e38, -0.0, 0.5, 1.0000001, float("nan"), float("inf"), float("-inf")]
EDGE_NUMBERS = st.sampled_from(NUMBERS)
SCALARS = st.one_of(EDGE_NUMBERS, st.none(), st.booleans(), st.integers(),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))


def json_trees(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Any JSON-like value: scalars (edge numbers, NaN, unicode) in nested lists and objects."""
    return st.recursive(SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
        max_leaves=max_leaves)


def _slots(doc: Any, parent: Any = None, key: Any = None) -> list[tuple[Any, Any]]:
    """Every (container, key) of ``doc``, the root as (None, None)."""
    out = [(parent, key)]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _slots(v, doc, k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _slots(v, doc, i)
    return out


def mutated(base: Any, max_changes: int = 3) -> st.SearchStrategy[Any]:
    """``base`` with one value replaced (by an edge number or any scalar), or with up to
    ``max_changes`` parts broken (:func:`broken`)."""
    return st.one_of(st.sampled_from(leaf_edits(base)), broken(base, max_changes))


@st.composite
def broken(draw: Callable, base: Any, max_changes: int = 3) -> Any:
    """``base`` (a valid document) with 1..``max_changes`` parts broken: a value replaced by
    an edge number, any scalar or any JSON tree, a key or item removed, an unknown key added, a value wrapped in a list or
    turned into its text, a list repeated; or the whole document replaced."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_changes))):
        parent, key = draw(st.sampled_from(_slots(doc)))
        value = doc if parent is None else parent[key]
        op = draw(st.sampled_from(["number", "scalar", "tree", "delete", "add", "wrap", "text",
                                   "repeat"]))
        if op == "number":
            new = draw(EDGE_NUMBERS)
        elif op == "scalar":
            new = draw(SCALARS)
        elif op == "tree":
            new = draw(json_trees())
        elif op == "delete" and parent is not None:
            del parent[key]
            continue
        elif op == "add" and isinstance(value, dict):
            value[draw(st.text(max_size=12))] = draw(json_trees(4))
            continue
        elif op == "wrap":
            new = [value]
        elif op == "text":
            new = json.dumps(value) if not isinstance(value, str) else value + "\u00e9\U0001f600"
        elif op == "repeat" and isinstance(value, list):
            new = value * draw(st.integers(0, 40))
        else:
            new = draw(json_trees(4))
        if parent is None:
            doc = new
        else:
            parent[key] = new
    return doc


EDGE_VALUES = [*NUMBERS, None, True, False, "", "0.5", "\u00e9\U0001f600", [], {}, [[]],
               {"": None}]


def leaf_edits(base: Any) -> list[Any]:
    """Every copy of ``base`` with one value replaced by one of :data:`EDGE_VALUES` (edge
    numbers, wrong types, unicode, empty containers): a boundary sweep, in order. Only the
    first item of each list is edited (the others are alike)."""
    out = []

    def paths(doc: Any, at: tuple) -> list[tuple]:
        found = [at]
        if isinstance(doc, dict):
            for k, v in doc.items():
                found += paths(v, at + (k,))
        elif isinstance(doc, list) and doc:
            found += paths(doc[0], at + (0,))
        return found

    for path in paths(base, ())[1:]:
        for value in EDGE_VALUES:
            doc = copy.deepcopy(base)
            slot = doc
            for k in path[:-1]:
                slot = slot[k]
            slot[path[-1]] = copy.deepcopy(value)
            out.append(doc)
    return out


def json_bytes(doc: Any) -> bytes:
    """``doc`` as JSON text; NaN and the infinities written as Python's json writes them
    (``NaN``, ``Infinity``: not JSON, which a strict parser refuses)."""
    return json.dumps(doc, allow_nan=True).encode()


def raw_bodies(base: bytes) -> st.SearchStrategy[bytes]:
    """Bytes that are not a well-formed document: random bytes, ``base`` cut short or with
    bytes spliced in, deep nesting, invalid UTF-8, an empty body."""
    cut = st.integers(0, len(base)).map(lambda n: base[:n])
    spliced = st.tuples(st.integers(0, len(base)), st.binary(min_size=1, max_size=16)).map(
        lambda t: base[:t[0]] + t[1] + base[t[0]:])
    deep = st.integers(1, 700).map(lambda n: b"[" * n + b"]" * n)
    return st.one_of(st.binary(max_size=200), cut, spliced, deep,
                     st.sampled_from([b"", b"null", b"\xff\xfe{}", b"{\"inputs\": NaN}", b"[]",
                                      b"\"\\ud800\"", b"{\"a\":1,\"a\":2}"]))


def fuzz(check: Callable[[Any], None], strategy: st.SearchStrategy[Any], examples: int,
         sweep: Iterable[Any] = ()) -> int:
    """Run ``check`` on every input of ``sweep`` (e.g. :func:`leaf_edits`), then on
    ``examples`` drawn inputs (the same ones every run); the number tried. A failing check
    fails the caller (Hypothesis shrinks a drawn input to a small example first)."""
    tried = [0]
    for value in sweep:
        tried[0] += 1
        check(value)

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value: Any) -> None:
        tried[0] += 1
        check(value)

    run()
    return tried[0]


def reuse_cli_parser(monkeypatch: Any) -> None:
    """Build hetflow's command-line parser once for many ``main()`` calls (building it is
    most of a call's time); ``main`` parses and handles errors as always."""
    import hetflow.cli.main as cli

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)


def report(capsys: Any, line: str) -> None:
    """Print a fuzz count past pytest's capture (``capsys``: the test's fixture); the counts
    go into docs/reliability.md."""
    with capsys.disabled():
        print(f"\n{line}", flush=True)


def one_line_message(text: str) -> bool:
    """A message for a person: not empty, one line, no traceback."""
    return bool(text.strip()) and "\n" not in text.strip() and "Traceback" not in text


__all__ = ["EDGE_NUMBERS", "EDGE_VALUES", "broken", "fuzz", "leaf_edits", "json_bytes", "json_trees", "mutated", "one_line_message",
           "raw_bodies", "report", "reuse_cli_parser"]
