"""The bundled datasets and the stateless step -> batch order."""

from __future__ import annotations

import numpy as np
import torch

from hetflow.workloads.train.data import (
    CORPUS_MODULES,
    StepOrder,
    corpus_bytes,
    digits_arrays,
    load_dataset,
)


def test_digits_split_is_fixed_by_seed() -> None:
    a = load_dataset("digits", val_fraction=0.2, seed=0)
    b = load_dataset("digits", val_fraction=0.2, seed=0)
    c = load_dataset("digits", val_fraction=0.2, seed=1)
    assert len(a.train) + len(a.val) == 1797 and len(a.val) == 359
    assert a.train.inputs.shape[1] == 64 and float(a.train.inputs.max()) <= 1.0
    assert set(a.train.targets.tolist()) == set(range(10))
    assert torch.equal(a.val.inputs, b.val.inputs)
    assert not torch.equal(a.val.inputs, c.val.inputs)


def test_digits_read_from_the_shipped_file_are_scikit_learns() -> None:
    """The file read directly (no scikit-learn import) gives exactly load_digits()'s arrays."""
    from sklearn.datasets import load_digits

    data, target = digits_arrays()
    bunch = load_digits()
    assert data.shape == (1797, 64) and np.array_equal(data, bunch.data)
    assert np.array_equal(target, bunch.target) and target.dtype.kind == "i"


def test_text_windows_are_shifted_byte_tokens() -> None:
    data = load_dataset("python-source", val_fraction=0.1, seed=0, seq_len=16)
    x, y = data.train.inputs, data.train.targets
    assert x.shape[1] == 16 and x.dtype == torch.int64 and int(x.max()) < 256
    assert torch.equal(x[:, 1:], y[:, :-1])  # the target is the next byte
    text = corpus_bytes()
    assert b"def " in text and len(text) > 100_000 and len(CORPUS_MODULES) == 10
    assert corpus_bytes() == text


def test_step_order_is_a_function_of_the_step() -> None:
    order = StepOrder(100, 8, seed=3)
    first = [order.global_batch(s) for s in range(30)]
    again = StepOrder(100, 8, seed=3)
    # Asked out of order, as a resumed job does: the same batches.
    for s in (17, 3, 29, 0):
        assert torch.equal(again.global_batch(s), first[s])
    # One epoch (12 steps of 8 from 100) sees no sample twice; the next epoch reshuffles.
    epoch0 = torch.cat(first[:12])
    assert len(set(epoch0.tolist())) == 96
    assert not torch.equal(first[12], first[0])


def test_replicas_split_the_global_batch() -> None:
    order = StepOrder(100, 8, seed=0)
    for dp in (1, 2, 4):
        parts = [order.replica_batch(5, i, dp) for i in range(dp)]
        assert torch.equal(torch.cat(parts), order.global_batch(5))


def test_prepared_arrays_become_tensors_without_a_copy() -> None:
    import warnings

    import pytest

    from hetflow.core.errors import InputError
    from hetflow.workloads.train.data import dataset_from_arrays, split_arrays

    arrays = split_arrays(load_dataset("digits", val_fraction=0.2, seed=0))
    for a in arrays.values():
        a.flags.writeable = False  # as Ray's object store hands them out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's read-only warning would fail here
        data = dataset_from_arrays("digits", arrays)
    assert data.train.inputs.data_ptr() == arrays["train_inputs"].ctypes.data
    assert data.val.targets.data_ptr() == arrays["val_targets"].ctypes.data
    assert len(data.train) == 1438 and len(data.val) == 359
    del arrays["val_targets"]
    with pytest.raises(InputError, match="lacks val_targets"):
        dataset_from_arrays("digits", arrays)
    short = split_arrays(load_dataset("digits", val_fraction=0.2, seed=0))
    short["train_targets"] = short["train_targets"][:10]
    with pytest.raises(InputError, match="differ in length"):
        dataset_from_arrays("digits", short)
