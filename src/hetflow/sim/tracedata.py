"""The public traces hetflow knows (``data/traces.yaml`` in this package) and fetching them.

The catalogue is data: per dataset its upstream repository and pinned commit, each file's
upstream path, size and SHA-256, its licence, and what of it the repository ships under
``data/traces/`` (data/README.md). :func:`fetch` downloads a dataset's files from
``BASE/REPO/COMMIT/PATH`` - BASE is ``https://raw.githubusercontent.com``, or a mirror with the
same layout (``--mirror`` / ``HETFLOW_TRACES_MIRROR``) - and keeps a file only when its size and
SHA-256 are the catalogue's: each is written to a temporary name beside its destination and
renamed into place after the check, so a failed or tampered download leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from hetflow.core.errors import HetflowError, InputError

CATALOGUE = Path(__file__).resolve().parent / "data" / "traces.yaml"
SCHEMA = "hetflow.traces/v1"
MIRROR_ENV = "HETFLOW_TRACES_MIRROR"
TIMEOUT_S = 60.0
CHUNK = 1 << 16


class ChecksumMismatch(HetflowError):
    """A downloaded file is not the one the catalogue names (exit 1: nothing was kept)."""


@dataclass(frozen=True)
class TraceFile:
    name: str  # path under the destination (and under the repository's in_repo folder)
    path: str  # path in the upstream repository
    size: int
    sha256: str


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    source: str
    licence: str
    shipped: str  # "full", "slice" or "none"
    in_repo: str | None
    repo: str | None = None
    commit: str | None = None
    files: tuple[TraceFile, ...] = ()
    local_size: int | None = None  # data made by the hetflow team: no upstream file
    slice: dict[str, Any] | None = None

    @property
    def fetchable(self) -> bool:
        return bool(self.files)

    @property
    def size(self) -> int:
        """Bytes of the full dataset (the upstream files, uncompressed)."""
        return sum(f.size for f in self.files) if self.files else int(self.local_size or 0)

    @property
    def upstream(self) -> str:
        return f"{self.repo}@{self.commit[:7]}" if self.repo and self.commit else "-"

    def url(self, f: TraceFile, base: str) -> str:
        return f"{base.rstrip('/')}/{self.repo}/{self.commit}/{urllib.parse.quote(f.path, safe='/=')}"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "size_bytes": self.size,
                "source": self.source, "licence": self.licence, "shipped": self.shipped,
                "in_repo": self.in_repo, "upstream": None if not self.repo else
                {"repo": self.repo, "commit": self.commit}, "files": len(self.files),
                "fetchable": self.fetchable, "slice": self.slice}


def _dataset(name: str, d: dict[str, Any]) -> Dataset:
    files = tuple(TraceFile(str(f["name"]), str(f["path"]), int(f["size"]), str(f["sha256"]).lower())
                  for f in d.get("files") or ())
    return Dataset(name, str(d["description"]), str(d["source"]), str(d["licence"]), str(d["shipped"]),
                   d.get("in_repo"), d.get("repo"), d.get("commit"), files, d.get("size"), d.get("slice"))


def load_catalogue(path: Path = CATALOGUE) -> dict[str, Dataset]:
    """Every dataset of the catalogue, by name, in the file's order."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert data.get("schema") == SCHEMA, f"{path}: schema {data.get('schema')!r}, expected {SCHEMA}"
    return {name: _dataset(name, d) for name, d in data["datasets"].items()}


def catalogue_base_url(path: Path = CATALOGUE) -> str:
    return str(yaml.safe_load(path.read_text(encoding="utf-8"))["base_url"])


def find_dataset(name: str, catalogue: dict[str, Dataset] | None = None) -> Dataset:
    catalogue = load_catalogue() if catalogue is None else catalogue
    if name not in catalogue:
        raise InputError(f"unknown trace {name!r}; known: {', '.join(catalogue)} (`hetflow traces list`)")
    return catalogue[name]


def default_dest(name: str) -> Path:
    """``$XDG_CACHE_HOME/hetflow/traces/NAME`` (``~/.cache/...`` without it)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "hetflow" / "traces" / name


def base_url(mirror: str | None = None) -> tuple[str, str]:
    """(base URL, where it came from): ``mirror``, else ``HETFLOW_TRACES_MIRROR``, else the
    catalogue's (raw GitHub)."""
    if mirror:
        base, origin = mirror, "--mirror"
    elif os.environ.get(MIRROR_ENV):
        base, origin = os.environ[MIRROR_ENV], MIRROR_ENV
    else:
        return catalogue_base_url(), "the catalogue"
    scheme = urllib.parse.urlparse(base).scheme
    if scheme not in ("http", "https") or not urllib.parse.urlparse(base).netloc:
        raise InputError(f"{base!r} ({origin}) is not an http:// or https:// URL; a mirror is the base that "
                         f"replaces https://raw.githubusercontent.com (files at BASE/OWNER/REPO/COMMIT/PATH)")
    return base, origin


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Fetched:
    file: TraceFile
    target: Path
    url: str
    downloaded: bool  # False: the file was there already with the right checksum


def _download(url: str, f: TraceFile, target: Path, origin: str) -> None:
    """``url`` -> ``target``, atomically, only if the bytes are the catalogue's."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        h, n = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 (http/https checked)
                    while chunk := resp.read(CHUNK):
                        n += len(chunk)
                        if n > f.size:  # never more than the catalogue's size: no need to read a huge answer
                            break
                        h.update(chunk)
                        out.write(chunk)
            except urllib.error.HTTPError as e:
                raise InputError(f"cannot download {url}: HTTP {e.code} {e.reason}; check the URL's base "
                                 f"({origin})") from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", None) or e
                raise InputError(f"cannot download {url}: {reason}; check the network or the base URL "
                                 f"({origin}; a mirror: --mirror URL or {MIRROR_ENV})") from None
        digest = h.hexdigest()
        if n != f.size or digest != f.sha256:
            got = f"more than {f.size} bytes" if n > f.size else f"{n} bytes with SHA-256 {digest[:16]}..."
            raise ChecksumMismatch(f"{url}: {got}, expected {f.size} bytes with SHA-256 {f.sha256[:16]}...; "
                                   f"not kept, nothing written to {target} (a damaged download, or a mirror "
                                   f"serving other content)")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def require_fetchable(ds: Dataset) -> None:
    if not ds.fetchable:
        raise InputError(f"{ds.name} has no upstream file to fetch ({ds.source}); the repository ships it "
                         f"in {ds.in_repo}")


def fetch(ds: Dataset, dest: Path, mirror: str | None = None,
          progress: Callable[[Fetched], None] | None = None) -> list[Fetched]:
    """Every file of ``ds`` under ``dest`` (its ``name``s), each checked by size and SHA-256;
    a file already there with the right checksum is kept and not downloaded again."""
    require_fetchable(ds)
    base, origin = base_url(mirror)
    done = []
    for f in ds.files:
        target = dest / f.name
        url = ds.url(f, base)
        there = target.is_file() and target.stat().st_size == f.size and sha256_of(target) == f.sha256
        if not there:
            _download(url, f, target, origin)
        item = Fetched(f, target, url, downloaded=not there)
        if progress:
            progress(item)
        done.append(item)
    return done


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
