"""Everything the project needs is in the project: no tracked file names the team's old workbench
beside the repository (``../shared``) or builds a path to a sibling ``shared`` folder. A clean
clone - CI's, a user's - has nothing beside it; the fixtures and traces live in
tests/fixtures/topology and data/traces (data/README.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# What reaching a sibling `shared` folder looks like, in any language the repository holds.
PATTERNS = [
    re.compile(r"\.\.[/\\]+shared\b"),  # ../shared, ..\shared: docs, shell, YAML, strings
    re.compile(r"\.parents?(\[\s*-?\d+\s*\])?\s*/\s*[\"']shared[\"']"),  # REPO.parent / "shared", parents[2] / "shared"
    re.compile(r"[\"']\.\.[\"']\s*\)?\s*(,|/)\s*[\"']shared[\"']"),  # os.path.join(x, "..", "shared"), Path("..") / "shared"
    re.compile(r"with_name\(\s*[\"']shared[\"']\s*\)"),  # REPO.with_name("shared")
]


def offending_lines(text: str) -> list[int]:
    return sorted({text.count("\n", 0, m.start()) + 1 for p in PATTERNS for m in p.finditer(text)})


def test_the_patterns_catch_every_way_seen_so_far() -> None:
    seen = ['SHARED = REPO.parent / "shared"', 'Path(__file__).resolve().parents[1].parent / "shared" / "traces"',
            "--trace ../shared/traces/philly/philly.csv", 'os.path.join(root, "..", "shared")',
            "ln -s \"$REPO/$SHARED\" ../shared", "Path('..') / 'shared'", 'REPO.with_name("shared")',
            r"..\shared\traces"]
    assert all(offending_lines(s) == [1] for s in seen), [s for s in seen if not offending_lines(s)]
    fine = ["shared GPUs", 'FIXTURES = REPO / "tests" / "fixtures"', '"name": "shared"', "/shared/snap.pt",
            "shared-memory size"]
    assert not any(offending_lines(s) for s in fine)


def test_no_tracked_file_reaches_outside_the_repository() -> None:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    files = [f for f in done.stdout.decode().split("\0") if f and f != THIS]
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
