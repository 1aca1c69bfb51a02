"""Reading a user's YAML file: one clear InputError for a missing file or bad YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hetflow.core.errors import InputError


def read_user_text(path: str | Path, what: str) -> str:
    """The text of a file the user named; InputError (naming it as ``what``) when it cannot be
    read or is not UTF-8 text (a binary file given by mistake)."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text file (byte {exc.start} is not UTF-8); give the "
                         f"{what} as a YAML text file") from None


def read_yaml(path: str | Path, what: str) -> Any:
    """The parsed document of ``path``; ``what`` names it in errors ("training config")."""
    path = Path(path)
    text = read_user_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())  # one line
        raise InputError(f"{where}: not valid YAML ({problem})") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise InputError(f"{path}: nested too deeply to read; a {what} is a few levels of "
                         "mappings and lists") from None
