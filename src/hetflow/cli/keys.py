"""``hetflow keys create | list | revoke | rotate | usage``: API keys of ``hetflow serve``'s
front door (docs/serving.md, "Gateway").

    hetflow keys create team-a --models digits --rps 100 --quota "100000/day"
    hetflow keys create bot --tokens-per-min 20000 --quota "5000000 tokens/month" --expires 2027-06-30
    hetflow keys list                 # names, limits, state, today's usage (never a key)
    hetflow keys rotate team-a        # a new key, same limits; the old one stops within a second
    hetflow keys revoke team-a
    hetflow keys usage team-a --json

``create`` and ``rotate`` print the key once, on stdout; only its salted hash is stored. The
store: ``~/.hetflow/keys`` (or ``$HETFLOW_KEYS_DIR``, or ``--store DIR``) for a front door on
this machine; with ``--address`` the Ray cluster's key-value store (``auth: {store: cluster}``
in the serving config). Exit codes: 0 done, 2 bad input or no such key or no cluster.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from hetflow.core.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", help="Ray cluster whose key store to use (auth.store: cluster)")
    common.add_argument("--store", metavar="DIR", help="key directory (default ~/.hetflow/keys or "
                                                        "$HETFLOW_KEYS_DIR)")
    common.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("keys", help="API keys of the serving front door", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="keys_verb", metavar="VERB", parser_class=type(p))
    c = verbs.add_parser("create", parents=[common], help="make a key (printed once)")
    c.add_argument("name")
    c.add_argument("--models", help="comma-separated models the key may use (default: all)")
    c.add_argument("--rps", type=int, help="requests per second (any sliding second)")
    c.add_argument("--burst", type=int, help="with --rps: requests allowed in any one second, the --rps "
                   "rate then holding over any 10 s")
    c.add_argument("--tokens-per-min", type=int, help="generated tokens per sliding minute")
    c.add_argument("--quota", help='"N/day", "N requests/month", "N tokens/day" (UTC days and months)')
    c.add_argument("--expires", help="date (2027-01-31, UTC) or ISO time the key stops working")
    c.set_defaults(func=run_create)
    for verb, helptext, func in (("revoke", "stop a key at once", run_revoke),
                                 ("rotate", "a new key for a name; the old one stops", run_rotate)):
        v = verbs.add_parser(verb, parents=[common], help=helptext)
        v.add_argument("name")
        v.set_defaults(func=func)
    v = verbs.add_parser("list", parents=[common], help="keys, their limits and today's usage")
    v.set_defaults(func=run_list)
    v = verbs.add_parser("usage", parents=[common], help="requests and tokens per day and month")
    v.add_argument("name", nargs="?")
    v.set_defaults(func=run_usage)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _store(args: argparse.Namespace) -> Any:
    from hetflow.workloads.serve.keys import open_store

    if args.address:
        if args.store:
            raise InputError("give --address (the cluster's key store) or --store DIR, not both")
        import logging

        import ray

        from hetflow.runtime.session import check_reachable

        check_reachable(args.address)  # an unreachable cluster: one line, exit 2
        ray.init(address=args.address, log_to_driver=False, logging_level=logging.ERROR)
        return open_store("cluster")
    return open_store(args.store)


def _positive(value: int | None, flag: str) -> int | None:
    if value is not None and value <= 0:
        raise InputError(f"{flag} must be a positive number, got {value}")
    return value


def run_create(args: argparse.Namespace) -> int:
    from hetflow.workloads.serve.keys import create_key, parse_expiry, parse_quota

    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    if args.models is not None and not models:
        raise InputError("--models needs at least one model name (leave it out for all models)")
    key = create_key(_store(args), args.name, models=models, rps=_positive(args.rps, "--rps"),
                     burst=_positive(args.burst, "--burst"),
                     tokens_per_min=_positive(args.tokens_per_min, "--tokens-per-min"),
                     quota=parse_quota(args.quota) if args.quota else None,
                     expires=parse_expiry(args.expires) if args.expires else None)
    if args.json:
        print(json.dumps({"name": args.name, "key": key}))
    else:
        print(key)
        import sys

        print(f"(the key of {args.name}; shown only now - store it; clients send "
              "Authorization: Bearer KEY)", file=sys.stderr)
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    from hetflow.workloads.serve.keys import rotate_key

    key = rotate_key(_store(args), args.name)
    print(json.dumps({"name": args.name, "key": key}) if args.json else key)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from hetflow.workloads.serve.keys import revoke_key

    revoke_key(_store(args), args.name)
    print(json.dumps({"name": args.name, "state": "revoked"}) if args.json else f"revoked {args.name}")
    return 0


def _rows(store: Any, name: str | None = None) -> list[dict[str, Any]]:
    from hetflow.workloads.serve.keys import describe

    records = store.records()
    if name is not None and name not in records:
        raise InputError(f"no key named {name!r} in {store.where} (hetflow keys list shows them)")
    return [describe(r, store.usage(n)) for n, r in sorted(records.items())
            if name is None or n == name]


def run_list(args: argparse.Namespace) -> int:
    rows = _rows(_store(args))
    if args.json:
        print(json.dumps({"keys": rows}, indent=1))
        return 0
    if not rows:
        print("no keys (hetflow keys create NAME makes one)")
        return 0
    print(f"{'NAME':<20} {'STATE':<8} {'MODELS':<18} {'RPS/BURST':>10} {'TOK/MIN':>8} {'QUOTA':<22} "
          f"{'TODAY':>8} EXPIRES")
    for r in rows:
        models = r["models"] if isinstance(r["models"], str) else ",".join(r["models"])
        rps = f"{r['rps']}/{r['burst']}" if r.get("burst") else (r["rps"] or "-")
        print(f"{r['name']:<20} {r['state']:<8} {models[:18]:<18} {rps:>10} "
              f"{r['tokens_per_min'] or '-':>8} {r['quota'] or '-':<22} {r['today']['requests']:>8} "
              f"{(r['expires'] or '-')[:19]}")
    return 0


def run_usage(args: argparse.Namespace) -> int:
    store = _store(args)
    rows = _rows(store, args.name)
    if args.json:
        print(json.dumps({"usage": {r["name"]: store.usage(r["name"]) for r in rows}}, indent=1))
        return 0
    print(f"{'NAME':<20} {'PERIOD':<11} {'REQUESTS':>10} {'TOKENS':>12}")
    for r in rows:
        for period, counts in sorted(store.usage(r["name"]).items()):
            print(f"{r['name']:<20} {period:<11} {counts.get('requests', 0):>10} {counts.get('tokens', 0):>12}")
    return 0
