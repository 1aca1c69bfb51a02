"""``hetflow <verb> ...``: argument parsing and printing only; the work lives in the layers below.

Each verb is a module in this package with ``register(subparsers)``, which adds its parser and
sets ``func`` (called with the parsed args, returns an exit code). Exit codes: 0 success,
2 bad input (one line, no traceback), 3 unschedulable request, 1 other failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hetflow import __version__
from hetflow.core.errors import HetflowError

# Verb modules, in the order `hetflow --help` lists them.
COMMAND_MODULES = ["inventory", "plan", "node", "simulate", "train", "launch", "tune", "serve", "run", "jobs", "top",
                   "k8s"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one line, like every bad input
        self.exit(2, f"hetflow: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hetflow",
        description="Run AI work on clusters of mixed accelerators on top of Ray.",
    )
    parser.add_argument("--version", action="version", version=f"hetflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(f"hetflow.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except HetflowError as e:
        print(f"hetflow: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("hetflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:
        # A path the system refuses (too long, a directory, no permission) that a command did
        # not check itself: one line, exit 2 when it names the file (input), else 1.
        name = str(e.filename) if e.filename is not None else ""
        name = name[:120] + "..." if len(name) > 120 else name
        print(f"hetflow: error: {name + ': ' if name else ''}{e.strerror or e}", file=sys.stderr)
        return 2 if e.filename is not None else 1


if __name__ == "__main__":
    sys.exit(main())
