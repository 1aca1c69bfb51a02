"""Sharded, atomic checkpoints with torch.distributed.checkpoint (DCP).

On disk, under the job's checkpoint directory::

    step-00000050/            a complete checkpoint: 50 optimizer steps done
        .metadata  __*.distcp DCP's files (each rank writes its own shards)
        meta.json             step, loss history, layout, wall time
        COMPLETE              the marker, written last
    .partial-step-00000060/   being written (or left by a crash): never read

Writing (``save_checkpoint``, called by every rank at the same step):

1. rank 0 clears ``.partial-step-N`` (a leftover of a crashed attempt) and creates it; barrier;
2. every rank writes its shards with ``dcp.save`` (DCP fsyncs the files it writes; its
   coordinator writes ``.metadata`` after all ranks reported);
3. rank 0 writes ``meta.json``, then ``COMPLETE``, fsyncs every file and the directory, renames
   the directory to ``step-N`` (atomic within one filesystem) and fsyncs the parent; barrier.

So a directory named ``step-N`` holding ``COMPLETE`` is whole; anything else is ignored by
:func:`latest_checkpoint` ("latest" = the highest complete step). Ranks on several nodes must
share the directory (NFS, Lustre, a mounted bucket): DCP writes each rank's shards locally.

Model keys are the single-device model's names (``model.layers.0.attention.wq.weight``) for
every layout, so a checkpoint from one layout loads into another (DCP reshards) and into a plain
single-device model (:func:`load_model_weights`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

# torch.distributed.checkpoint is imported where a DCP checkpoint is read or written, not here:
# importing it costs about 0.6 CPU-s (DTensor's operator tables), and most processes that import
# this module - every hetflow.train rank and Tune trial, whose checkpoints are directories of
# files (below) - never touch DCP (issue 28: the suite's ranks and trials are 100+ processes).
# ModelState and OptimizerState need no base class: DCP's ``Stateful`` is a runtime-checkable
# protocol (a ``state_dict`` and a ``load_state_dict`` method).

COMPLETE = "COMPLETE"
META = "meta.json"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def partial_dir_name(step: int) -> str:
    return f".partial-{step_dir_name(step)}"


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint: its directory, how many steps it holds, and its meta.json."""

    path: Path
    step: int
    meta: dict[str, Any]


class ModelState:
    """The model's weights under single-device names, whatever wraps or shards it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        set_model_state_dict(self.model, state_dict)


class OptimizerState:
    """The optimizer's state keyed by parameter names (not positions), so it reshards too."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


def list_checkpoints(root: str | Path) -> list[CheckpointInfo]:
    """Complete checkpoints under ``root``, oldest first. Partial or unreadable ones are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if not match or not (entry / COMPLETE).is_file():
            continue
        try:
            meta = json.loads((entry / META).read_text())
        except (OSError, ValueError):
            continue  # a marker without readable meta is not a checkpoint we wrote
        if meta.get("step") != int(match.group(1)) or not (entry / ".metadata").is_file():
            continue
        found.append(CheckpointInfo(entry, int(match.group(1)), meta))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(root: str | Path) -> CheckpointInfo | None:
    """The complete checkpoint with the most steps, or None."""
    complete = list_checkpoints(root)
    return complete[-1] if complete else None


def save_checkpoint(root: str | Path, step: int, state: dict[str, Any], meta: dict[str, Any],
                    *, keep_last: int | None = None) -> Path:
    """Write ``state`` (values may be Stateful) as checkpoint ``step``; every rank calls this.

    ``meta`` (JSON-ready; only rank 0's is written) gets ``step`` and ``saved_at`` added.
    Returns the final directory. When ``keep_last`` is set, rank 0 then removes the oldest
    complete checkpoints beyond that many.
    """
    root = Path(root)
    rank = dist.get_rank() if dist.is_initialized() else 0
    partial, final = root / partial_dir_name(step), root / step_dir_name(step)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    _barrier()
    import torch.distributed.checkpoint as dcp
    with _single_process_quiet():
        dcp.save(state, checkpoint_id=partial, no_dist=not dist.is_initialized())
    if rank == 0:
        _publish(partial, final, {**meta, "step": step, "saved_at": time.time()})
        if keep_last:
            for old in list_checkpoints(root)[:-keep_last]:
                shutil.rmtree(old.path, ignore_errors=True)
    _barrier()
    return final


def _publish(partial: Path, final: Path, meta: dict[str, Any]) -> None:
    _write_synced(partial / META, json.dumps(meta, sort_keys=True).encode())
    for path in partial.iterdir():
        if path.is_file():
            _fsync_path(path)
    _write_synced(partial / COMPLETE, b"")
    _fsync_path(partial)
    if final.exists():
        # Only a re-run of the very same step can get here (a resumed job never writes below
        # its latest checkpoint); the partial copy is as complete, so it replaces the old one.
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync_path(final.parent)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is the intent."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def remove_partials(root: str | Path) -> int:
    """Delete the partial directories crashed attempts left; call only while no job writes."""
    root = Path(root)
    removed = 0
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith(".partial-"):
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
    return removed


def load_checkpoint(info: CheckpointInfo, state: dict[str, Any]) -> None:
    """Load ``info`` into ``state`` in place (every rank calls this with its own share)."""
    import torch.distributed.checkpoint as dcp
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=info.path, no_dist=not dist.is_initialized())


def load_model_weights(info: CheckpointInfo, model: nn.Module) -> None:
    """Load a checkpoint's weights into a plain single-device model, in a process with no
    process group (evaluation, export)."""
    import torch.distributed.checkpoint as dcp
    state = {"model": model.state_dict()}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=info.path, no_dist=True)
    model.load_state_dict(state["model"])


# -- hetflow.train's checkpoints: directories of files (Ray Train's format) --------------------

META_FILE = ".hetflow_checkpoint.json"  # in a committed checkpoint_<n>: its index and metrics
CHECKPOINT_RE = re.compile(r"^checkpoint_(\d{6})$")


@dataclass(frozen=True)
class Checkpoint:
    """A directory of files (Ray Train's ``Checkpoint``: ``from_directory``, ``as_directory``,
    ``to_directory``, ``path``)."""

    path: str

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> "Checkpoint":
        return cls(str(Path(path).absolute()))

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        yield self.path

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        import tempfile

        target = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="checkpoint-"))
        shutil.copytree(self.path, target, dirs_exist_ok=True)
        return str(target)

    @property
    def metrics(self) -> dict[str, Any]:
        """The metrics reported with this checkpoint (committed checkpoints only)."""
        meta = Path(self.path) / META_FILE
        return json.loads(meta.read_text())["metrics"] if meta.is_file() else {}

    @property
    def index(self) -> int | None:
        match = CHECKPOINT_RE.match(Path(self.path).name)
        return int(match.group(1)) if match else None


def committed_checkpoints(root: str | os.PathLike) -> list[Checkpoint]:
    """Every committed checkpoint under ``root``, oldest first (partial ones are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = sorted((int(m.group(1)), p) for p in root.iterdir()
                   if (m := CHECKPOINT_RE.match(p.name)) and (p / META_FILE).is_file())
    return [Checkpoint(str(p)) for _, p in found]


def latest_committed(root: str | os.PathLike) -> Checkpoint | None:
    """The newest committed ``checkpoint_<n>`` under ``root`` (None when there is none)."""
    found = committed_checkpoints(root)
    return found[-1] if found else None


def ranked_checkpoints(found: list[Checkpoint], score: tuple[str, str] | None) -> list[Checkpoint]:
    """``found`` worst first: by the metric ``score[0]`` (``score[1]``: "max" - higher is
    better - or "min"; a checkpoint without that metric ranks worst), else oldest first."""
    if score is None:
        return list(found)
    metric, order = score

    def key(item: tuple[int, Checkpoint]) -> tuple[int, float, int]:
        value = item[1].metrics.get(metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return (0, 0.0, item[0])
        return (1, float(value) if order == "max" else -float(value), item[0])
    return [c for _, c in sorted(enumerate(found), key=key)]


def beyond_keep(found: list[Checkpoint], keep: int, score: tuple[str, str] | None) -> list[Checkpoint]:
    """The committed checkpoints to remove: all but the best ``keep`` and the newest (the one a
    restart resumes from), as Ray Train's checkpoint manager does."""
    if len(found) <= keep:
        return []
    newest = found[-1]
    return [c for c in ranked_checkpoints(found, score)[:-keep] if c != newest]


__all__ = [
    "CHECKPOINT_RE", "META_FILE", "Checkpoint", "beyond_keep", "committed_checkpoints", "latest_committed",
    "ranked_checkpoints",
    "COMPLETE", "META", "CheckpointInfo", "ModelState", "OptimizerState", "latest_checkpoint",
    "list_checkpoints", "load_checkpoint", "load_model_weights", "partial_dir_name",
    "remove_partials", "save_checkpoint", "step_dir_name",
]
