"""`hetflow inventory` as a user runs it: this machine, recorded files, a cluster file, bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.cli.main import main
from tests.conftest import FIXTURES, REPO, fixture_path

EXAMPLE_CLUSTER = REPO / "examples" / "cluster-mixed.yaml"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inventory_of_this_machine_is_a_cpu_node(capsys) -> None:
    code, out, _ = run_cli(capsys, "inventory", "--json")
    assert code == 0
    snap = json.loads(out)
    (node,) = snap["nodes"]
    assert node["cpu_cores"] == os.cpu_count()
    assert node["host_memory_bytes"] > 0
    # this test machine has no GPU: the node is a CPU node, not an error
    assert [d["vendor"] for d in node["devices"]] == ["cpu"]


def test_inventory_table_of_this_machine(capsys) -> None:
    code, out, _ = run_cli(capsys, "inventory")
    assert code == 0
    assert f"{os.cpu_count()} CPU cores" in out


def test_inventory_from_recorded_topology_and_memory(capsys) -> None:
    code, out, _ = run_cli(
        capsys, "inventory", "--json", "--from",
        str(fixture_path("nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt")),
    )
    assert code == 0
    (node,) = json.loads(out)["nodes"]
    assert len(node["devices"]) == 8
    assert len(node["links"]) == 28
    assert {l["kind"] for l in node["links"]} == {"nvswitch"}
    assert all(l["bandwidth_gbps"] and l["bandwidth_gbps"] > 100 for l in node["links"])
    assert [d["numa_node"] for d in node["devices"]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_inventory_of_example_cluster(capsys) -> None:
    code, out, _ = run_cli(capsys, "inventory", "--json", "--cluster", str(EXAMPLE_CLUSTER))
    assert code == 0
    snap = json.loads(out)
    nodes = snap["nodes"]
    assert len(nodes) == 4 + 4 + 2 + 2 + 1 + 1 + 2
    models = [d["model"] for n in nodes for d in n["devices"]]
    assert models.count("MI300X") == 4 * 8 + 8
    gpus = [d for n in nodes for d in n["devices"] if d["vendor"] != "cpu"]
    assert len(gpus) == 32 + 32 + 16 + 8 + 8 + 8
    names = [n["name"] for n in nodes]
    assert len(set(names)) == len(names)
    # the snapshot JSON is itself a valid --cluster input
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"snap-{os.getpid()}.json"
    path.write_text(out)
    try:
        code2, out2, _ = run_cli(capsys, "inventory", "--json", "--cluster", str(path))
    finally:
        path.unlink()
    assert code2 == 0 and json.loads(out2) == snap


def test_cluster_table_groups_identical_nodes(capsys) -> None:
    code, out, _ = run_cli(capsys, "inventory", "--cluster", str(EXAMPLE_CLUSTER))
    assert code == 0
    assert "16 nodes" in out
    assert "and 3 identical" in out  # 4 MI300X nodes print once


@pytest.mark.parametrize(
    "content, expected",
    [
        ("nodes:\n  - {count: 2, node: 8x MI300X, colour: red}\n", "cluster.yaml:2: nodes[0]: unknown key 'colour'"),
        ("nodes:\n  - {count: two, node: 8x MI300X}\n", "cluster.yaml:2: nodes[0].count: expected a whole number"),
        ("nodes:\n  - {count: 2, node: 8x MI300Z}\n", "did you mean"),
        ("nodes:\n  - {count: 2}\n", "give exactly one of"),
        ("nodes: [\n", "cluster.yaml"),
        ("nodez: []\n", "unknown key 'nodez'"),
        ("nodes:\n  - {from: [missing-file.txt]}\n", "missing-file.txt"),
    ],
)
def test_bad_cluster_file_exits_2_with_one_line(capsys, tmp_path, content, expected) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    code, out, err = run_cli(capsys, "inventory", "--cluster", str(path))
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert expected in err


def test_missing_and_unknown_files_exit_2(capsys, tmp_path) -> None:
    code, _, err = run_cli(capsys, "inventory", "--from", str(tmp_path / "nope.txt"))
    assert code == 2 and "no such file" in err
    junk = tmp_path / "junk.txt"
    junk.write_text("hello world\nthis is not a tool output\n")
    code, _, err = run_cli(capsys, "inventory", "--from", str(junk))
    assert code == 2 and "not a recorded tool output" in err


def test_console_script_prints_no_traceback_on_bad_input(tmp_path) -> None:
    junk = tmp_path / "junk.xml"
    junk.write_bytes(b"<nvidia_smi_log><gpu><product_name>X</product_name")
    exe = Path(sys.executable).parent / "hetflow"
    out = subprocess.run([str(exe), "inventory", "--from", str(junk)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("hetflow: error:")


TEXT_FIXTURES = sorted(
    p.name for p in FIXTURES.iterdir() if p.suffix in {".txt", ".xml", ".json", ".csv"}
    and p.name not in {"API-NOTES.md", "BANDWIDTH.md", "SOURCES.md"}
)


@pytest.mark.parametrize("name", TEXT_FIXTURES)
def test_every_text_fixture_loads_through_the_cli(capsys, name) -> None:
    code, out, err = run_cli(capsys, "inventory", "--json", "--from", str(fixture_path(name)))
    assert code == 0, err
    (node,) = json.loads(out)["nodes"]
    assert node["devices"], f"{name}: no device found"


def _garble(text: str, rnd: random.Random, how: str) -> str:
    lines = text.splitlines(keepends=True)
    if how == "truncate":
        return text[: rnd.randrange(len(text) + 1)]
    if how == "shuffle":
        rnd.shuffle(lines)
        return "".join(lines)
    if how == "columns":  # swap two whitespace-separated columns on every line
        out = []
        for line in lines:
            cells = line.split()
            if len(cells) > 2:
                i, j = rnd.sample(range(len(cells)), 2)
                cells[i], cells[j] = cells[j], cells[i]
            out.append(" ".join(cells) + "\n")
        return "".join(out)
    pos = rnd.randrange(len(text) + 1)  # splice random bytes in
    noise = "".join(chr(rnd.randrange(1, 0x2FF)) for _ in range(rnd.randrange(1, 40)))
    return text[:pos] + noise + text[pos:]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    name=st.sampled_from(TEXT_FIXTURES),
    how=st.sampled_from(["truncate", "shuffle", "columns", "noise"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_garbled_fixtures_exit_0_or_2_never_a_traceback(capsys, tmp_path, name, how, seed) -> None:
    text = fixture_path(name).read_text(errors="replace")
    path = tmp_path / f"garbled-{name}"
    path.write_text(_garble(text, random.Random(seed), how))
    code = main(["inventory", "--json", "--from", str(path)])  # an exception fails the test
    out, err = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:  # with --json the error is one JSON object on stdout (docs/cli.md)
        assert err == "" and len(out.strip().splitlines()) == 1
        assert json.loads(out)["error"]["exit_code"] == 2
    else:
        json.loads(out)


# --- fuzzed cluster files (`--cluster`: a cluster YAML or a snapshot JSON) ---------------------


def _example_cluster() -> dict:
    """examples/cluster-mixed.yaml with its recorded files' paths made absolute (the fuzzed
    copies are written elsewhere)."""
    import yaml

    doc = yaml.safe_load(EXAMPLE_CLUSTER.read_text())
    for node in doc["nodes"]:
        if "from" in node:
            node["from"] = [str(EXAMPLE_CLUSTER.parent / f) for f in node["from"]]
    return doc


def test_fuzzed_cluster_files_exit_0_or_2_with_one_line(capsys, tmp_path, monkeypatch) -> None:
    """`hetflow inventory --json --cluster FILE` on cluster YAMLs and snapshot JSONs with
    broken values, keys and bytes: exit 0 (a valid cluster: its snapshot) or 2 with one line."""
    import yaml

    from tests.fuzzing import (fuzz, json_bytes, leaf_edits, mutated, one_line_message, raw_bodies,
                               report, reuse_cli_parser)

    reuse_cli_parser(monkeypatch)
    example = _example_cluster()
    small = {"inter_node_gbps": 25, "nodes": [{"count": 1, "node": "2x L40S", "name": "l"},
                                              {"count": 1, "node": "cpu", "name": "c"}]}
    # a catalog entry and a recorded one (the example's first), fewer devices: quicker to load
    good = {"inter_node_gbps": 12.5, "nodes": [
        {"count": 2, "node": "2x H100", "name": "h"},
        {**next(n for n in example["nodes"] if "from" in n), "name": "r"}]}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    assert main(["inventory", "--json", "--cluster", str(tmp_path / "small.yaml")]) == 0
    snapshot = json.loads(capsys.readouterr().out)
    as_yaml = lambda doc: yaml.safe_dump(doc, allow_unicode=True).encode()  # noqa: E731
    outcomes = {0: 0, 2: 0}

    def check(case: tuple[str, bytes]) -> None:
        suffix, text = case
        path = tmp_path / f"cluster{suffix}"
        path.write_bytes(text)
        code = main(["inventory", "--json", "--cluster", str(path)])  # an exception fails it
        out, err = capsys.readouterr()
        assert code in (0, 2) and err == "", (code, text[:200], out[:200], err)
        outcomes[code] += 1
        if code == 0:
            assert json.loads(out)["nodes"]
        else:  # with --json the error is one JSON object on stdout (docs/cli.md)
            assert len(out.strip().splitlines()) == 1, out
            error = json.loads(out)["error"]
            assert error["exit_code"] == 2 and one_line_message(error["message"]), out

    yamls = st.one_of(mutated(good), mutated(small)).map(lambda d: (".yaml", as_yaml(d)))
    jsons = mutated(snapshot).map(lambda d: (".json", json_bytes(d)))
    raws = st.one_of(raw_bodies(as_yaml(small)).map(lambda b: (".yaml", b)),
                     raw_bodies(json.dumps(snapshot).encode()).map(lambda b: (".json", b)))
    sweep = [(".yaml", as_yaml(example)), (".yaml", as_yaml(good)),
             (".json", json.dumps(snapshot).encode()),
             (".yaml", b"[" * 600 + b"]" * 600), (".json", b"[" * 600 + b"]" * 600),
             (".yaml", b"{nodes: " * 600 + b"1" + b"}" * 600)]
    sweep += [(".yaml", as_yaml(doc)) for doc in leaf_edits(small)]
    sweep += [(".json", json_bytes(doc)) for doc in leaf_edits(snapshot)[::4]]
    tried = fuzz(check, st.one_of(yamls, jsons, raws), 150, sweep)
    report(capsys, f"fuzz: {tried} cluster files to `hetflow inventory --cluster` ({outcomes[0]} "
                   f"valid: exit 0; {outcomes[2]} exit 2 with one line), never a traceback")
    assert outcomes[0] >= 3  # the good ones (and some fuzzed) are accepted
