"""Reading a user's YAML file: one clear InputError for a missing file or bad YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hetflow.core.errors import InputError


def read_yaml(path: str | Path, what: str) -> Any:
    """The parsed document of ``path``; ``what`` names it in errors ("training config")."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise InputError(f"{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
