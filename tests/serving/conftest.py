"""A trained digits checkpoint for the serving tests, made in-process in a few seconds.

The same format the training job writes (``save_checkpoint``: DCP shards, meta.json, COMPLETE),
so the serving code loads it exactly as it loads a checkpoint from ``hetflow train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hetflow.workloads.train.checkpoint import ModelState, save_checkpoint
from hetflow.workloads.train.config import TrainConfig, config_from_dict
from hetflow.workloads.train.data import StepOrder, load_dataset
from hetflow.workloads.train.models import build_model, loss_fn

STEPS = 300


@dataclass(frozen=True)
class Trained:
    config: TrainConfig
    train_dict: dict
    checkpoint_dir: Path


def train_digits(root: Path, hidden: list[int], steps: int = STEPS) -> Trained:
    """Train a digits MLP on one CPU process and save its final checkpoint under ``root``."""
    data = {
        "name": "serve-digits",
        "model": {"kind": "mlp", "hidden": hidden},
        "train": {"steps": steps, "batch_size": 64, "lr": 0.003},
        "checkpoint": {"dir": str(root)},
        "resources": {"devices": "cpu"},
    }
    config = config_from_dict(data)
    torch.set_num_threads(1)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr)
    dataset = load_dataset("digits", val_fraction=config.data.val_fraction, seed=config.data.seed)
    order = StepOrder(len(dataset.train), config.train.batch_size, config.data.seed)
    for step in range(steps):
        inputs, targets = dataset.train.take(order.global_batch(step))
        loss = loss_fn(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_checkpoint(root, steps, {"model": ModelState(model)}, {"note": "serving tests"})
    return Trained(config, config.model_dump(mode="json"), root)


@pytest.fixture(scope="session")
def digits_model(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    return train_digits(tmp_path_factory.mktemp("digits-ckpt"), [128, 128])
