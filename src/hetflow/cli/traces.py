"""``hetflow traces``: the public cluster traces hetflow knows, and fetching their full files.

    hetflow traces list [--json]
    hetflow traces fetch philly --dest traces/philly
    HETFLOW_TRACES_MIRROR=http://mirror.example/raw hetflow traces fetch gavel

The catalogue (``hetflow/sim/data/traces.yaml``) names each dataset's upstream repository and
pinned commit, each file's size and SHA-256, its licence, and what the repository ships under
data/traces (in full, a slice, or nothing; data/README.md). ``fetch`` downloads from
``BASE/OWNER/REPO/COMMIT/PATH``, BASE being https://raw.githubusercontent.com or a mirror with
the same layout (``--mirror URL``, else ``HETFLOW_TRACES_MIRROR``). A file is kept only when its
size and SHA-256 are the catalogue's: it is written to a temporary name in DIR and renamed once
checked, so a failed or tampered download leaves nothing behind (exit 1); an unknown name, a bad
mirror URL or an unreachable source is exit 2. Files already in DIR with the right checksum are
not downloaded again. Default DIR: $XDG_CACHE_HOME/hetflow/traces/NAME (~/.cache/...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("traces", help="list the public cluster traces, fetch their full files (checked by SHA-256)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="traces_command", metavar="{list,fetch}", parser_class=type(p))
    verbs.required = True  # `hetflow traces` alone: one line, exit 2, like any missing argument
    ls = verbs.add_parser("list", help="names, sizes, sources, licences, and what the repository ships")
    ls.add_argument("--json", action="store_true", help="print the catalogue as JSON")
    ls.set_defaults(func=run_list)
    fe = verbs.add_parser("fetch", help="download a dataset's full upstream files, checking each SHA-256")
    fe.add_argument("name", metavar="NAME", help="a dataset of `hetflow traces list`")
    fe.add_argument("--dest", metavar="DIR", help="where the files go (default $XDG_CACHE_HOME/hetflow/traces/NAME)")
    fe.add_argument("--mirror", metavar="URL", help="base URL instead of https://raw.githubusercontent.com: files "
                    "are read from URL/OWNER/REPO/COMMIT/PATH (default: $HETFLOW_TRACES_MIRROR)")
    fe.set_defaults(func=run_fetch)


def run_list(args: argparse.Namespace) -> int:
    from hetflow.sim.tracedata import human_size, load_catalogue

    catalogue = load_catalogue()
    if args.json:
        print(json.dumps([d.as_json() for d in catalogue.values()], indent=2))
        return 0
    rows = [("NAME", "SIZE", "SHIPPED", "UPSTREAM", "SOURCE / LICENCE")]
    for d in catalogue.values():
        shipped = d.shipped + (f" ({d.slice['rows']} rows)" if d.shipped == "slice" and d.slice else "")
        rows.append((d.name, human_size(d.size), shipped, d.upstream if d.fetchable else "- (in the repo only)",
                     d.source))
        rows.append(("", "", "", "", f"licence: {d.licence}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    print("\n`hetflow traces fetch NAME` downloads a dataset's full files (checked by SHA-256); "
          "the repository keeps what it ships under data/traces (data/README.md).")
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from hetflow.sim.tracedata import base_url, default_dest, fetch, find_dataset, human_size, require_fetchable

    ds = find_dataset(args.name)
    require_fetchable(ds)
    base_url(args.mirror)  # a bad mirror URL is one line before anything is printed
    dest = Path(args.dest) if args.dest else default_dest(ds.name)

    def report(item) -> None:
        how = "downloaded" if item.downloaded else "already there"
        print(f"  {item.file.name}  {human_size(item.file.size)}  sha256 ok  ({how})", file=sys.stderr, flush=True)

    print(f"fetching {ds.name}: {len(ds.files)} file(s), {human_size(ds.size)}, from {ds.upstream} ({ds.licence})",
          file=sys.stderr, flush=True)
    done = fetch(ds, dest, args.mirror, progress=report)
    print(f"{ds.name}: {len(done)} file(s) in {dest}")
    return 0
