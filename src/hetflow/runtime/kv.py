"""Durable key-value stores: one interface (:class:`KeyValue`), two homes.

- :class:`RayKV`: Ray's GCS key-value store in one namespace (the process must be connected to
  the cluster; it survives every worker and, with Redis fault tolerance, a head restart);
- :class:`DirectoryKV`: one file per key under a directory, each put written to a temporary
  file, fsynced and renamed (atomic on POSIX); ``private=True`` keeps the directory 0700 (the
  files are always 0600: ``mkstemp``'s mode).

Used by the cluster controller's job records (control/state.py) and the gateway's API keys
(workloads/serve/keys.py). Importing this module imports no Ray.
"""

from __future__ import annotations

import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Protocol


class KeyValue(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class RayKV:
    """Ray's GCS key-value store, keys in ``namespace``."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def get(self, key: str) -> bytes | None:
        from ray.experimental import internal_kv

        return internal_kv._internal_kv_get(key, namespace=self.namespace)

    def put(self, key: str, value: bytes) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def delete(self, key: str) -> None:
        from ray.experimental import internal_kv

        internal_kv._internal_kv_del(key, namespace=self.namespace)

    def keys(self, prefix: str) -> list[str]:
        from ray.experimental import internal_kv

        found = internal_kv._internal_kv_list(prefix, namespace=self.namespace) or []
        return sorted(k.decode() if isinstance(k, bytes) else k for k in found)


class DirectoryKV:
    """One file per key under ``root`` (created on the first put); a put is write-temp + fsync +
    rename. ``private``: the directory is kept 0700 (files are 0600 either way)."""

    def __init__(self, root: str | os.PathLike[str], *, private: bool = False) -> None:
        self.root = Path(root)
        self.private = private

    def _path(self, key: str) -> Path:
        return self.root / urllib.parse.quote(key, safe="")

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, key: str, value: bytes) -> None:
        mode = 0o700 if self.private else 0o777
        self.root.mkdir(parents=True, exist_ok=True, mode=mode)
        if self.private:
            os.chmod(self.root, 0o700)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(value)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash
        finally:
            os.close(dir_fd)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def keys(self, prefix: str) -> list[str]:
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return []
        names = (urllib.parse.unquote(p.name) for p in entries if not p.name.startswith(".tmp-"))
        return sorted(k for k in names if k.startswith(prefix))


__all__ = ["DirectoryKV", "KeyValue", "RayKV"]
