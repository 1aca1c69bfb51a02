"""``hetflow <verb> ...``: argument parsing and printing only; the work lives in the layers below.

Each verb is a module in this package with ``register(subparsers)``, which adds its parser and
sets ``func`` (called with the parsed args, returns an exit code). One exit code per meaning,
the same for every verb (``EXIT_CODES``, docs/cli.md): 0 success, 1 the work failed, 2 bad
input or a setup to fix (one line, no traceback: arguments, files, an unreachable cluster, a
missing optional package), 3 cannot fit, 4 the job was cancelled (``submit --wait``), 130
interrupted; ``launch`` passes a failing rank's own code through. With ``--json`` an error is
one JSON object on stdout: ``{"error": {"message", "exit_code", "kind"}}``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from hetflow import __version__
from hetflow.core.errors import HetflowError, InputError
from hetflow.runtime.tracking import MISSING_MLFLOW

# Verb modules, in the order `hetflow --help` lists them.
COMMAND_MODULES = ["inventory", "plan", "node", "simulate", "capacity", "traces", "train", "launch", "tune", "serve", "keys", "run", "jobs",
                   "top", "k8s", "completion"]

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_UNSCHEDULABLE, EXIT_CANCELLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = {  # code -> (kind in a --json error, meaning); docs/cli.md shows this table
    EXIT_OK: ("ok", "success"),
    EXIT_FAILED: ("failed", "the work failed: a job, stage, rank or check failed, or an error at run time"),
    EXIT_INPUT: ("input", "bad input or a setup to fix: arguments, files, configs, an unknown job, no or an "
                          "unreachable Ray cluster, a missing optional package (torch, scikit-learn)"),
    EXIT_UNSCHEDULABLE: ("unschedulable", "the request can never be placed on this cluster"),
    EXIT_CANCELLED: ("cancelled", "the job was cancelled before it finished (`submit --wait`)"),
    EXIT_INTERRUPTED: ("interrupted", "interrupted (Ctrl-C)"),
}

# Packages a verb may import late that are extras, not dependencies: the line that says how to add them.
MISSING_PACKAGES = {
    "torch": "PyTorch is not installed (hetflow's `torch` extra); install the build for this machine: "
             "CPU `pip install torch --index-url https://download.pytorch.org/whl/cpu` (or `make venv`), "
             "CUDA `pip install torch --index-url https://download.pytorch.org/whl/cu128`, "
             "ROCm `pip install torch --index-url https://download.pytorch.org/whl/rocm6.4`",
    "mlflow": MISSING_MLFLOW,
    "sklearn": "scikit-learn is not installed; the digits dataset comes from it (hetflow's `demo` extra): "
               "pip install -e '.[demo]' in a hetflow checkout, or pip install scikit-learn",
}

_json_errors = False  # set by main() when the command line asks for --json


def add_tracking_flags(p: argparse.ArgumentParser) -> None:
    """``--mlflow URI`` and ``--mlflow-experiment NAME`` (either turns MLflow tracking on;
    docs/tracking.md)."""
    p.add_argument("--mlflow", metavar="URI",
                   help="log this run to MLflow at URI, e.g. sqlite:///mlflow.db or http://host:5000 "
                        "(\"$MLFLOW_TRACKING_URI\" for MLflow's own setting); docs/tracking.md")
    p.add_argument("--mlflow-experiment", metavar="NAME",
                   help="MLflow experiment (default MLFLOW_EXPERIMENT_NAME, else the job's name); "
                        "turns tracking on")

DATASET_PACKAGES = {"digits": "sklearn"}  # built-in datasets that come from an optional package


def require(*packages: str, dataset: str | None = None) -> None:
    """Before any work starts: each package (a key of MISSING_PACKAGES) importable, and the
    package ``dataset`` comes from, else one InputError with the line that says how to add it."""
    import importlib.util

    if dataset in DATASET_PACKAGES:
        packages += (DATASET_PACKAGES[dataset],)
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise InputError(MISSING_PACKAGES[name])


def missing_package(exc: ImportError) -> str | None:
    """The install line for an optional package ``exc`` says is missing, else None."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and name in MISSING_PACKAGES:
        return MISSING_PACKAGES[name]
    return None


def fail(message: str, code: int) -> int:
    """Report an error as one line on stderr, or (``--json``) one JSON object on stdout."""
    if _json_errors:
        kind = EXIT_CODES.get(code, ("failed",))[0]
        print(json.dumps({"error": {"message": message, "exit_code": code, "kind": kind}}), flush=True)
    else:
        print(f"hetflow: error: {message}", file=sys.stderr, flush=True)
    return code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one line, like every bad input
        fail(f"{message} (see `{self.prog} --help`)", EXIT_INPUT)
        self.exit(EXIT_INPUT)


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


def _one_line_deprecations() -> None:
    """hetflow's own deprecations (an earlier spelling in a config file: ``FutureWarning``
    from hetflow) as one line on stderr, ``hetflow: deprecated: ...``, not Python's
    file-and-line form; every other warning as Python shows it."""
    import warnings

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, FutureWarning) and "hetflow" in str(filename):
            print(f"hetflow: deprecated: {message}", file=sys.stderr)
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    global _json_errors

    argv = list(sys.argv[1:] if argv is None else argv)
    # Before parsing, so that a parse error of a --json command line is JSON too (a launched
    # script's own --json, after SCRIPT, is the script's: parsing decides below).
    _json_errors = "--json" in argv
    parser = build_parser()
    args = parser.parse_args(argv)
    _json_errors = bool(getattr(args, "json", False))
    _one_line_deprecations()
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_INPUT
    try:
        return int(args.func(args) or 0)
    except HetflowError as e:
        return fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        return EXIT_OK
    except ImportError as e:
        hint = missing_package(e)
        if hint is None:
            raise
        return fail(hint, EXIT_INPUT)
    except OSError as e:
        # A path the system refuses (too long, a directory, no permission) that a command did
        # not check itself: one line, exit 2 when it names the file (input), else 1.
        name = str(e.filename) if e.filename is not None else ""
        name = name[:120] + "..." if len(name) > 120 else name
        return fail(f"{name + ': ' if name else ''}{e.strerror or e}",
                    EXIT_INPUT if e.filename is not None else EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
