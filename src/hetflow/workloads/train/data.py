"""The built-in datasets and the step -> samples order.

Nothing is downloaded. ``digits`` is scikit-learn's bundled 8x8 digits; ``python-source`` is
the source text of a fixed list of standard-library modules of the running Python, tokenised
as bytes (vocabulary 256) and cut into windows of ``seq_len + 1`` tokens.

The order is **stateless**: the global batch of step ``s`` is a function of (dataset size,
batch size, seed, s) alone - the ``s % steps_per_epoch``-th slice of epoch
``s // steps_per_epoch``'s seeded permutation. A job resumed at step s therefore sees exactly
the batches an uninterrupted job would have seen, with no sampler state to checkpoint, and a
different number of data-parallel replicas sees the same global batch (each replica takes a
contiguous share of it).
"""

from __future__ import annotations

import gzip
import importlib.util
import sysconfig
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from hetflow.core.errors import InputError

# Standard-library modules present in every CPython >= 3.11, read in this order.
CORPUS_MODULES = (
    "argparse.py", "bisect.py", "difflib.py", "fractions.py", "functools.py", "heapq.py",
    "json/decoder.py", "json/encoder.py", "string.py", "textwrap.py",
)


@dataclass(frozen=True)
class Split:
    """Inputs and targets of one split; row i of each is sample i."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[indices], self.targets[indices]


@dataclass(frozen=True)
class Dataset:
    name: str
    train: Split
    val: Split


def load_dataset(name: str, *, val_fraction: float, seed: int, seq_len: int = 64) -> Dataset:
    """``digits`` or ``python-source``, split into train and validation by ``seed``."""
    if name == "digits":
        inputs, targets = _digits()
    elif name == "python-source":
        inputs, targets = _text_windows(seq_len)
    else:
        raise InputError(f"unknown dataset {name!r}; expected digits or python-source")
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(seed))
    num_val = max(1, int(round(len(inputs) * val_fraction)))
    val, train = order[:num_val].sort().values, order[num_val:].sort().values
    return Dataset(name, Split(inputs[train], targets[train]), Split(inputs[val], targets[val]))


SPLIT_KEYS = ("train_inputs", "train_targets", "val_inputs", "val_targets")


def load_split(config: Any) -> Dataset:
    """The split a training config trains on: ``data.loader``'s when given, else its model
    spec's ``dataset`` (each called as ``fn(model_section, data_section)``)."""
    from hetflow.workloads.models.spec import resolve_callable, spec_of

    if config.data.loader is not None:
        source, load = f"data.loader {config.data.loader!r}", resolve_callable(config.data.loader)
    else:
        spec = spec_of(config.model)
        source, load = f"the {spec.name} spec's dataset", spec.dataset
    return as_dataset(config.dataset, load(config.model, config.data), source)


def as_dataset(name: str, value: Any, source: str = "the dataset function") -> Dataset:
    """A :class:`Dataset` from what a dataset function returned: a Dataset, or a mapping of
    the :data:`SPLIT_KEYS` arrays (numpy arrays or tensors)."""
    if isinstance(value, Dataset):
        return value
    if isinstance(value, Mapping):
        if all(isinstance(value.get(k), np.ndarray) for k in SPLIT_KEYS):
            return dataset_from_arrays(name, value)
        if all(isinstance(value.get(k), torch.Tensor) for k in SPLIT_KEYS):
            t = {k: value[k] for k in SPLIT_KEYS}
            return Dataset(name, Split(t["train_inputs"], t["train_targets"]),
                           Split(t["val_inputs"], t["val_targets"]))
        missing = [k for k in SPLIT_KEYS if k not in value]
        if missing:
            raise InputError(f"{source} returned a mapping without {', '.join(missing)}; "
                             f"return the arrays {', '.join(SPLIT_KEYS)}")
        raise InputError(f"{source} returned a mapping whose {', '.join(SPLIT_KEYS)} are not "
                         "all numpy arrays or all tensors")
    raise InputError(f"{source} returned a {type(value).__name__}; return a "
                     f"hetflow Dataset or a mapping of the arrays {', '.join(SPLIT_KEYS)}")


def split_arrays(dataset: Dataset) -> dict[str, np.ndarray]:
    """The dataset's split as numpy arrays (what a workflow's prepare stage hands on)."""
    return {"train_inputs": dataset.train.inputs.numpy(),
            "train_targets": dataset.train.targets.numpy(),
            "val_inputs": dataset.val.inputs.numpy(), "val_targets": dataset.val.targets.numpy()}


def dataset_from_arrays(name: str, arrays: Mapping[str, np.ndarray]) -> Dataset:
    """A :class:`Dataset` over arrays someone else prepared, without copying them.

    ``arrays`` has the keys of :data:`SPLIT_KEYS`. Arrays from Ray's object store are read-only
    views of its shared memory; the tensors made here share that memory (``torch.from_numpy``)
    and training only ever reads them (each batch is gathered into a new tensor), so the
    read-only warning torch gives for such arrays does not apply and is silenced.
    """
    missing = [k for k in SPLIT_KEYS if k not in arrays]
    if missing:
        raise InputError(f"prepared data for {name!r} lacks {', '.join(missing)}; "
                         f"expected the arrays {', '.join(SPLIT_KEYS)}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        t = {k: torch.from_numpy(arrays[k]) for k in SPLIT_KEYS}
    if len(t["train_inputs"]) != len(t["train_targets"]) or len(t["val_inputs"]) != len(t["val_targets"]):
        raise InputError(f"prepared data for {name!r}: inputs and targets differ in length")
    return Dataset(name, Split(t["train_inputs"], t["train_targets"]),
                   Split(t["val_inputs"], t["val_targets"]))


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8x8 images, pixels 0..16) as ``(data, target)``, the arrays
    ``sklearn.datasets.load_digits()`` returns.

    Read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``: 64 pixels
    then the label, one image per line) without importing scikit-learn: ``import
    sklearn.datasets`` costs every rank process ~1.8 s of CPU, the file 0.01 s. Falls back to
    ``load_digits()`` where the file is not where scikit-learn has kept it."""
    spec = importlib.util.find_spec("sklearn")  # locates the package; runs none of it
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


@lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    data, target = digits_arrays()
    # Pixels are 0..16; scale to 0..1 so the default initialisation suits them.
    inputs = torch.from_numpy(np.asarray(data, dtype=np.float32) / 16.0)
    targets = torch.from_numpy(np.asarray(target, dtype=np.int64))
    return inputs, targets


def corpus_bytes() -> bytes:
    """The text corpus: the listed standard-library sources, concatenated in order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in CORPUS_MODULES:
        path = stdlib / name
        try:
            parts.append(path.read_bytes())
        except OSError as exc:
            raise InputError(f"the python-source corpus needs {path} from the standard library "
                             f"({exc.strerror}); use a full Python installation") from None
    return b"\n".join(parts)


@lru_cache(maxsize=4)
def _text_windows(seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    count = (len(tokens) - 1) // seq_len
    starts = torch.arange(count) * seq_len
    windows = tokens[starts[:, None] + torch.arange(seq_len + 1)]
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class StepOrder:
    """Which training samples make up each step's global batch (see the module docstring)."""

    def __init__(self, num_samples: int, batch_size: int, seed: int) -> None:
        if batch_size > num_samples:
            raise InputError(f"train.batch_size {batch_size} is larger than the "
                             f"{num_samples} training samples; lower it")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = num_samples // batch_size  # the last partial batch is dropped
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.long)

    def global_batch(self, step: int) -> torch.Tensor:
        """Indices of step ``step`` (0-based) over all replicas."""
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.num_samples, generator=generator)
            self._epoch = epoch
        return self._perm[within * self.batch_size:(within + 1) * self.batch_size]

    def replica_batch(self, step: int, dp_index: int, dp: int) -> torch.Tensor:
        """The contiguous share of step ``step``'s global batch that replica ``dp_index`` trains on."""
        share = self.batch_size // dp
        return self.global_batch(step)[dp_index * share:(dp_index + 1) * share]


__all__ = ["CORPUS_MODULES", "Dataset", "SPLIT_KEYS", "Split", "StepOrder", "as_dataset",
           "corpus_bytes", "dataset_from_arrays", "load_dataset", "load_split", "split_arrays"]
