"""API keys of the gateway: what a key may do, and where the keys live.

A key is ``hf-`` + 43 URL-safe characters (256 random bits), shown once when it is made. The
store keeps only ``sha256(salt + key)`` - one salt per store, because the front door finds a
key by its hash (an HAProxy map lookup; per-key salts would need the key's identity first, and
a 256-bit random key gains nothing from them) - with the key's name and policy:

* ``models``: the models it may call (None: all);
* ``rps``: requests per second (at most that many in any sliding second);
* ``burst``: with ``rps``, up to that many in any sliding second, the ``rps`` rate then holding
  over a longer sliding window (:data:`hetflow.workloads.serve.access.SUSTAIN_S`);
* ``tokens_per_min``: generated tokens per sliding minute (generative endpoints);
* ``quota``: requests or tokens per UTC day or month (persisted; survives restarts);
* ``expires``: when it stops working; ``revoked``: it no longer works.

Two stores, one interface (:class:`KeyStore`): a directory (``~/.hetflow/keys`` or
``$HETFLOW_KEYS_DIR``; 0700, every file 0600, each written atomically) for a front door on this
machine, and the cluster's GCS key-value store (``cluster``; it survives a head restart with
Redis fault tolerance) for front doors on any node. ``version()`` changes on every write of a
key, so a front door polls one value to notice a revocation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hetflow.core.errors import InputError
from hetflow.runtime.kv import DirectoryKV, KeyValue, RayKV

KEY_PREFIX = "hf-"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
KEYS_DIR_ENV = "HETFLOW_KEYS_DIR"
KV_NAMESPACE = "hetflow-keys"


class Quota(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(gt=0)
    unit: Literal["requests", "tokens"] = "requests"
    period: Literal["day", "month"] = "day"

    def text(self) -> str:
        return f"{self.limit} {self.unit}/{self.period}"


MAX_QUOTA = 10**15
"""The largest quota: a million billion requests or tokens a day or month (HAProxy's maps hold
a quota's threshold in a signed 64-bit integer; counters past 2^32 are counted across wraps)."""

MAX_RATE = 2**31 - 1
"""The largest ``rps``, ``burst`` or ``tokens_per_min``: HAProxy counts a key's requests and tokens
in 32-bit counters and rates, so a larger limit could never be reached."""


class KeyRecord(BaseModel):
    """One key as stored: its hash and policy, never the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: tuple[str, ...] | None = None
    rps: int | None = Field(None, gt=0)
    burst: int | None = Field(None, gt=0)
    tokens_per_min: int | None = Field(None, gt=0)
    quota: Quota | None = None
    expires: float | None = None  # epoch seconds
    created: float = 0.0
    revoked: float | None = None  # epoch seconds of the revocation

    def usable(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.revoked is None and (self.expires is None or now < self.expires)

    def state(self, now: float | None = None) -> str:
        if self.revoked is not None:
            return "revoked"
        return "active" if self.usable(now) else "expired"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(salt: str, key: str) -> str:
    return hashlib.sha256((salt + key).encode()).hexdigest()


def parse_quota(text: str) -> Quota:
    """``1000/day``, ``1000 requests/day``, ``50000 tokens per month``."""
    m = re.fullmatch(r"\s*(\d+)\s*(requests?|tokens?)?\s*(?:/|per\s+)\s*(day|month)\s*", text or "")
    if not m:
        raise InputError(f"quota {text!r}: write N/day, N requests/day or N tokens/month")
    if int(m.group(1)) > MAX_QUOTA:
        raise InputError(f"quota {text!r}: at most {MAX_QUOTA:,} a day or month (HAProxy compares a "
                         "quota in 64-bit integers); leave the quota out for no limit")
    unit = "tokens" if (m.group(2) or "").startswith("token") else "requests"
    return Quota(limit=int(m.group(1)), unit=unit, period=m.group(3))


def parse_expiry(text: str) -> float:
    """``2027-01-31`` (the start of that UTC day) or an ISO time with a zone (``...T12:00Z``)."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"--expires {text!r}: write a date (2027-01-31) or an ISO time "
                         "(2027-01-31T12:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def period_key(period: str, now: float | None = None) -> str:
    day = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc)
    return day.strftime("%Y-%m-%d") if period == "day" else day.strftime("%Y-%m")


def period_end(period: str, now: float | None = None) -> float:
    """Epoch seconds when the current UTC day or month ends (a quota's reset)."""
    t = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.timezone.utc)
    if period == "day":
        start = t.replace(hour=0, minute=0, second=0, microsecond=0)
        return (start + dt.timedelta(days=1)).timestamp()
    first = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (first.replace(year=first.year + 1, month=1) if first.month == 12
           else first.replace(month=first.month + 1))
    return nxt.timestamp()


# -- stores -----------------------------------------------------------------------------------


class KeyStore:
    """Keys, the salt, per-key usage and a version, in a :class:`~hetflow.runtime.kv.KeyValue`
    (``key/<name>``, ``usage/<name>``, ``salt``, ``version``)."""

    where = "?"

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    def salt(self, create: bool = False) -> str:
        found = self.kv.get("salt")
        if found is None:
            if not create:
                return ""
            self.kv.put("salt", secrets.token_hex(16).encode())
            found = self.kv.get("salt")
        assert found is not None
        return found.decode()

    def version(self) -> str:
        found = self.kv.get("version")
        return found.decode() if found else ""

    def _bump(self) -> None:
        self.kv.put("version", f"{time.time_ns()}-{secrets.token_hex(4)}".encode())

    def records(self) -> dict[str, KeyRecord]:
        out = {}
        for entry in self.kv.keys("key/"):
            raw = self.kv.get(entry)
            if raw:
                record = KeyRecord.model_validate_json(raw)
                out[record.name] = record
        return out

    def put(self, record: KeyRecord) -> None:
        self.kv.put(f"key/{record.name}", record.model_dump_json().encode())
        self._bump()

    def usage(self, name: str) -> dict[str, dict[str, int]]:
        """period key (``2026-12-03`` or ``2026-12``) -> {"requests": n, "tokens": n}."""
        raw = self.kv.get(f"usage/{name}")
        return json.loads(raw) if raw else {}

    def put_usage(self, name: str, usage: dict[str, dict[str, int]]) -> None:
        self.kv.put(f"usage/{name}", json.dumps(usage, sort_keys=True).encode())


class DirectoryKeyStore(KeyStore):
    """A private directory (0700, files 0600): ``path``, ``$HETFLOW_KEYS_DIR`` or ``~/.hetflow/keys``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path or os.environ.get(KEYS_DIR_ENV) or Path.home() / ".hetflow" / "keys")
        self.where = str(self.path)
        super().__init__(DirectoryKV(self.path, private=True))


class _ConnectedRayKV(RayKV):
    """Ray's GCS store that says in one line when this process is not connected."""

    def _check(self) -> None:
        import ray

        if not ray.is_initialized():
            raise InputError("the cluster key store needs a connected Ray cluster (--address)")

    def get(self, key: str) -> bytes | None:
        self._check()
        return super().get(key)

    def put(self, key: str, value: bytes) -> None:
        self._check()
        super().put(key, value)

    def keys(self, prefix: str) -> list[str]:
        self._check()
        return super().keys(prefix)


class ClusterKeyStore(KeyStore):
    """Ray's GCS key-value store (namespace ``hetflow-keys``); needs a connected Ray."""

    where = "the cluster's key-value store"

    def __init__(self) -> None:
        super().__init__(_ConnectedRayKV(KV_NAMESPACE))


def open_store(spec: str | None) -> KeyStore:
    """``cluster``: the GCS store; ``file`` or None: the default directory; else a directory."""
    if spec == "cluster":
        return ClusterKeyStore()
    return DirectoryKeyStore(None if spec in (None, "", "file") else spec)


# -- the verbs ---------------------------------------------------------------------------------


def create_key(store: KeyStore, name: str, *, models: list[str] | None = None, rps: int | None = None,
               tokens_per_min: int | None = None, quota: Quota | None = None,
               expires: float | None = None, burst: int | None = None) -> str:
    """A new key named ``name`` (a name in use by an active key is refused); returns the key."""
    if not re.fullmatch(NAME_PATTERN, name or ""):
        raise InputError(f"key name {name!r}: letters, digits, '.', '_', '-' (up to 63), "
                         "starting with a letter or digit")
    old = store.records().get(name)
    if old is not None and old.revoked is None:
        raise InputError(f"a key named {name!r} exists; rotate it (hetflow keys rotate {name}) "
                         "or revoke it first")
    if expires is not None and expires <= time.time():
        raise InputError("--expires is in the past")
    for flag, value in (("--rps", rps), ("--burst", burst), ("--tokens-per-min", tokens_per_min)):
        if value is not None and value > MAX_RATE:
            raise InputError(f"{flag} {value:,} is past {MAX_RATE:,}, the most HAProxy's counters reach "
                             "(leave it out for no limit)")
    if burst is not None and (rps is None or burst < rps):
        raise InputError(f"--burst {burst}: a burst is the requests a key may send in one second above "
                         "its --rps rate; give --rps too, and a burst at least as large")
    key = new_key()
    store.put(KeyRecord(name=name, hash=key_hash(store.salt(create=True), key),
                        models=tuple(models) if models else None, rps=rps, burst=burst,
                        tokens_per_min=tokens_per_min, quota=quota, expires=expires,
                        created=time.time()))
    return key


def _existing(store: KeyStore, name: str) -> KeyRecord:
    record = store.records().get(name)
    if record is None:
        raise InputError(f"no key named {name!r} in {store.where} (hetflow keys list shows them)")
    return record


def revoke_key(store: KeyStore, name: str) -> KeyRecord:
    record = _existing(store, name)
    if record.revoked is None:
        record = record.model_copy(update={"revoked": time.time()})
        store.put(record)
    return record


def rotate_key(store: KeyStore, name: str) -> str:
    """A new key for ``name`` with the same policy and usage; the old key stops working."""
    record = _existing(store, name)
    if record.revoked is not None:
        raise InputError(f"key {name!r} is revoked; create a new one (hetflow keys create {name})")
    key = new_key()
    store.put(record.model_copy(update={"hash": key_hash(store.salt(create=True), key)}))
    return key


def describe(record: KeyRecord, usage: dict[str, dict[str, int]], now: float | None = None
             ) -> dict[str, Any]:
    """A key's row for ``keys list``/``keys usage`` (no key material)."""
    now = time.time() if now is None else now
    today, month = period_key("day", now), period_key("month", now)
    row: dict[str, Any] = {
        "name": record.name, "state": record.state(now),
        "models": list(record.models) if record.models else "all",
        "rps": record.rps, "burst": record.burst, "tokens_per_min": record.tokens_per_min,
        "quota": record.quota.text() if record.quota else None,
        "expires": (dt.datetime.fromtimestamp(record.expires, dt.timezone.utc).isoformat()
                    if record.expires else None),
        "created": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(),
        "today": usage.get(today, {"requests": 0, "tokens": 0}),
        "this_month": usage.get(month, {"requests": 0, "tokens": 0}),
    }
    return row


__all__ = ["ClusterKeyStore", "DirectoryKeyStore", "KEY_PREFIX", "KeyRecord", "KeyStore", "Quota",
           "create_key", "describe", "key_hash", "new_key", "open_store", "parse_expiry",
           "parse_quota", "period_end", "period_key", "revoke_key", "rotate_key"]
