"""Errors a user can hit. Each carries the exit code the CLI uses and says how to fix it.

Internal invariants are asserts, not these classes.
"""

from __future__ import annotations


class HetflowError(Exception):
    """Base class for errors meant for the user (printed as one line, no traceback)."""

    exit_code = 1


class InputError(HetflowError):
    """Bad input: a file, an argument or a config value. CLI exit code 2."""

    exit_code = 2


class ParseError(InputError):
    """A recorded tool output (or cluster file) could not be read.

    ``source`` is the file name, ``line`` the 1-based line number when known.
    """

    def __init__(self, source: str, message: str, line: int | None = None) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


class Unschedulable(HetflowError):
    """A request that no part of the cluster can satisfy. CLI exit code 3."""

    exit_code = 3
