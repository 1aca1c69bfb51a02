"""Everything the project needs is in the project: no tracked file names the team's old workbench
folder beside the repository or builds a path to that sibling folder. A clean clone - CI's, a
user's - has nothing beside it; the fixtures and traces live in tests/fixtures/topology and
data/traces (data/README.md). This file checks itself too: its examples are built from pieces
(``UP``, ``S``), so no line of it names the folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UP, S = "." * 2, "sha" + "red"  # the parent folder and the workbench's name, never spelled whole

# What reaching a sibling `shared` folder looks like, in any language the repository holds.
PATTERNS = [
    re.compile(r"\.\.[/\\]+shared\b"),  # UP/S or UP\S: docs, shell, YAML, strings
    re.compile(r"\.parents?(\[\s*-?\d+\s*\])?\s*/\s*[\"']shared[\"']"),  # REPO.parent / S, parents[2] / S
    re.compile(r"[\"']\.\.[\"']\s*\)?\s*(,|/)\s*[\"']shared[\"']"),  # os.path.join(x, UP, S), Path(UP) / S
    re.compile(r"with_name\(\s*[\"']shared[\"']\s*\)"),  # REPO.with_name(S)
]


def offending_lines(text: str) -> list[int]:
    return sorted({text.count("\n", 0, m.start()) + 1 for p in PATTERNS for m in p.finditer(text)})


def test_the_patterns_catch_every_way_seen_so_far() -> None:
    seen = [f'SHARED = REPO.parent / "{S}"', f'Path(__file__).resolve().parents[1].parent / "{S}" / "traces"',
            f"--trace {UP}/{S}/traces/philly/philly.csv", f'os.path.join(root, "{UP}", "{S}")',
            f"ln -s \"$REPO/$SHARED\" {UP}/{S}", f"Path('{UP}') / '{S}'", f'REPO.with_name("{S}")',
            f"{UP}\\{S}\\traces"]
    assert all(offending_lines(s) == [1] for s in seen), [s for s in seen if not offending_lines(s)]
    fine = ["shared GPUs", 'FIXTURES = REPO / "tests" / "fixtures"', '"name": "shared"', "/shared/snap.pt",
            "shared-memory size"]
    assert not any(offending_lines(s) for s in fine)


def test_no_tracked_file_reaches_outside_the_repository() -> None:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    files = [f for f in done.stdout.decode().split("\0") if f]
    assert len(files) > 100, "git ls-files listed almost nothing: not a checkout?"
    found = []
    for name in files:
        path = REPO / name
        if not path.is_file():  # deleted in the working tree, or a submodule
            continue
        text = path.read_bytes().decode("latin-1")  # any file, text or not: the patterns are ASCII
        found += [f"{name}:{line}" for line in offending_lines(text)]
    assert not found, ("these tracked files point at a folder beside the repository; the data is in "
                       f"tests/fixtures/topology and data/traces now: {', '.join(found)}")
