"""Build nodes and cluster snapshots from recorded files, catalog shorthand or JSON.

``load_node(paths)``      several recorded files of one machine -> enriched NodeTopology
``load_cluster(path)``    a cluster YAML, a snapshot JSON or a node JSON -> ClusterSnapshot

Cluster YAML (paths are relative to the YAML file)::

    inter_node_gbps: 25          # optional, GB/s per direction between nodes
    nodes:
      - {count: 16, node: 8x MI300X}                  # catalog shorthand
      - {count: 9, node: 4x V100, name: v100}         # name: prefix for the node names
      - {from: [dgx-a100_topo-m.txt, dgx-a100_q.xml]} # recorded files of one machine
      - {from: [mi300x_amd-smi-topology.txt], model: MI300X}  # model for files that omit it

Every error names the file, the line and what was expected.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Sequence

import yaml

from hetflow.core.errors import InputError, ParseError
from hetflow.core.serialize import NODE_SCHEMA, SNAPSHOT_SCHEMA, loads_snapshot
from hetflow.core.topology import ClusterSnapshot, NodeTopology

MAX_NODES = 100_000


def load_node(
    paths: Sequence[str | Path], name: str | None = None, model: str | None = None
) -> NodeTopology:
    """Recorded files (or node JSON) describing one machine -> one enriched node.

    ``model`` names the accelerator model for devices whose files do not say it (a topology
    matrix alone, e.g. ``amd-smi topology``, names no model); it must be a catalog name.
    """
    from hetflow.accelerators.enrich import enrich_node
    from hetflow.accelerators.merge import merge_nodes
    from hetflow.accelerators.recorded import parse_file, read_text

    parts = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix == ".json" and _is_hetflow_json(path):
            snap = loads_snapshot(read_text(path), str(path))
            if len(snap.nodes) != 1:
                raise InputError(f"{path}: holds {len(snap.nodes)} nodes; use --cluster for a cluster")
            parts.append(snap.nodes[0])
        else:
            parts.append(parse_file(path))
    node = merge_nodes(parts)
    node = dataclasses.replace(node, name=name or _default_name(paths))
    if model is not None:
        from hetflow.accelerators.catalog import default_catalog

        canonical = default_catalog().lookup(model).name  # InputError with did-you-mean
        node = dataclasses.replace(node, devices=tuple(
            d if d.model or d.name else dataclasses.replace(d, name=canonical)
            for d in node.devices
        ))
    return enrich_node(node)


def _default_name(paths: Sequence[str | Path]) -> str:
    stem = Path(paths[0]).name
    stem = re.sub(r"(\.tar)?\.(gz|tgz|txt|xml|json|csv)$", "", stem)
    return stem.split("_")[0] or "node0"


def _is_hetflow_json(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:4096]
    except OSError:
        return False
    return NODE_SCHEMA in head or SNAPSHOT_SCHEMA in head


def load_cluster(path: str | Path) -> ClusterSnapshot:
    """A cluster YAML, a snapshot JSON (``hetflow inventory --json``) or a node JSON."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file (expected a cluster YAML or a snapshot JSON)")
    from hetflow.accelerators.recorded import read_text

    text = read_text(p)
    if p.suffix == ".json" or text.lstrip().startswith("{"):
        return loads_snapshot(text, str(p))
    return _cluster_from_yaml(text, p)


# --- cluster YAML --------------------------------------------------------------------------

_NODE_KEYS = {"count", "node", "from", "name", "model"}
_TOP_KEYS = {"nodes", "inter_node_gbps"}


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _fail(source: Path, node: yaml.Node, message: str) -> ParseError:
    return ParseError(str(source), message, line=_line(node))


def _mapping(source: Path, node: yaml.Node, where: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(source, node, f"{where}: expected a mapping (key: value)")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            raise _fail(source, k, f"{where}: keys must be plain names")
        out[k.value] = (k, v)
    return out


def _scalar(source: Path, node: yaml.Node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise _fail(source, node, f"{where}: expected a single value")
    return yaml.safe_load(yaml.serialize(node))


def _cluster_from_yaml(text: str, source: Path) -> ClusterSnapshot:
    from hetflow.accelerators.synthetic import synthetic_node

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ParseError(str(source), f"not valid YAML ({problem})", line=line) from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ParseError(str(source), "nested too deeply to read; a cluster file is 'nodes:' "
                                      "with a list of {count, node} or {from: [files]}") from None
    if root is None:
        raise ParseError(str(source), "empty file; expected 'nodes:' with a list of nodes")
    top = _mapping(source, root, "top level")
    for key, (knode, _) in top.items():
        if key not in _TOP_KEYS:
            raise _fail(source, knode, f"unknown key {key!r}; expected one of {sorted(_TOP_KEYS)}")
    if "nodes" not in top:
        raise _fail(source, root, "missing 'nodes:' (a list of {count, node} or {from: [files]})")
    inter = 25.0
    if "inter_node_gbps" in top:
        vnode = top["inter_node_gbps"][1]
        inter = _scalar(source, vnode, "inter_node_gbps")
        number = isinstance(inter, (int, float)) and not isinstance(inter, bool)
        try:
            inter = float(inter) if number else math.nan
        except OverflowError:  # a whole number past float's range
            inter = math.inf
        if not 0 < inter < math.inf:  # (NaN fails too)
            raise _fail(source, vnode, "inter_node_gbps: expected a positive number (GB/s)")
    seq = top["nodes"][1]
    if not isinstance(seq, yaml.SequenceNode) or not seq.value:
        raise _fail(source, seq, "nodes: expected a non-empty list")
    nodes: list[NodeTopology] = []
    used: set[str] = set()
    for i, entry in enumerate(seq.value):
        where = f"nodes[{i}]"
        fields = _mapping(source, entry, where)
        for key, (knode, _) in fields.items():
            if key not in _NODE_KEYS:
                raise _fail(
                    source, knode, f"{where}: unknown key {key!r}; expected {sorted(_NODE_KEYS)}"
                )
        if ("node" in fields) == ("from" in fields):
            raise _fail(source, entry, f"{where}: give exactly one of 'node: 8x MI300X' or 'from: [files]'")
        count = 1
        if "count" in fields:
            cnode = fields["count"][1]
            count = _scalar(source, cnode, f"{where}.count")
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_NODES:
                raise _fail(source, cnode, f"{where}.count: expected a whole number from 1 to {MAX_NODES}")
        prefix = None
        model = None
        if "model" in fields:
            if "from" not in fields:
                raise _fail(source, fields["model"][0], f"{where}: 'model' goes with 'from' (shorthand names its model)")
            model = str(_scalar(source, fields["model"][1], f"{where}.model"))
        if "name" in fields:
            prefix = str(_scalar(source, fields["name"][1], f"{where}.name"))
        try:
            if "node" in fields:
                vnode = fields["node"][1]
                spec_text = str(_scalar(source, vnode, f"{where}.node"))
                template = synthetic_node(spec_text, "template")
                prefix = prefix or re.sub(r"[^a-z0-9]+", "-", spec_text.lower()).strip("-")
            else:
                vnode = fields["from"][1]
                files = _file_list(source, vnode, f"{where}.from")
                template = load_node([source.parent / f for f in files], model=model)
                prefix = prefix or template.name
        except ParseError:
            raise
        except InputError as e:
            raise _fail(source, vnode, f"{where}: {e}") from None
        if len(nodes) + count > MAX_NODES:
            raise _fail(source, entry, f"more than {MAX_NODES} nodes in one cluster")
        for k in range(count):
            name = prefix if count == 1 and prefix not in used else f"{prefix}-{k}"
            while name in used:
                name += "x"
            used.add(name)
            nodes.append(dataclasses.replace(template, name=name))
    return ClusterSnapshot(nodes=tuple(nodes), inter_node_gbps=float(inter))


def _file_list(source: Path, node: yaml.Node, where: str) -> list[str]:
    if isinstance(node, yaml.ScalarNode):
        return [str(node.value)]
    if isinstance(node, yaml.SequenceNode) and node.value:
        return [str(_scalar(source, n, where)) for n in node.value]
    raise _fail(source, node, f"{where}: expected a file name or a list of file names")


__all__ = ["load_node", "load_cluster"]
