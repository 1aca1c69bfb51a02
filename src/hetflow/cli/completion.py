"""``hetflow completion bash|zsh|tcsh``: print a shell completion script (made by shtab).

    source <(hetflow completion bash)                      # this shell
    hetflow completion bash > ~/.local/share/bash-completion/completions/hetflow
    hetflow completion zsh > "${fpath[1]}/_hetflow"        # zsh: a directory on $fpath

The script is generated from the same parser the commands use, so every verb, subcommand and
option completes, and file arguments (configs, job files, recorded tool output) complete paths.
It is static: nothing runs while you press Tab.
"""

from __future__ import annotations

import argparse
import sys

SHELLS = ("bash", "zsh", "tcsh")
_FILE_HINTS = (".yaml", "FILE", "SCRIPT", "DIR")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash, zsh, tcsh)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=run)


def _mark_paths(parser: argparse.ArgumentParser) -> None:
    """Let arguments that take a path complete as paths (shtab reads ``action.complete``)."""
    import shtab

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _mark_paths(child)
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else ""
        if metavar and any(h in metavar for h in _FILE_HINTS):
            action.complete = shtab.DIRECTORY if metavar == "DIR" else shtab.FILE  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> int:
    try:
        import shtab
    except ModuleNotFoundError:
        from hetflow.core.errors import InputError

        raise InputError("shell completion needs shtab: pip install shtab (it comes with "
                         "hetflow's dependencies; reinstall with pip install -e .)") from None
    from hetflow.cli.main import build_parser

    parser = build_parser()
    _mark_paths(parser)
    sys.stdout.write(shtab.complete(parser, shell=args.shell))
    return 0
