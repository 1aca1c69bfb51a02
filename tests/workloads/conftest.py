"""One multi-process run (gloo on CPU, up to 4 processes) shared by the layout and resume tests.

Starting Python and importing torch costs seconds per process on two cores, so every job the
tests need runs in one world of processes (``launch.run_worlds``), once per session.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hetflow.workloads.train.config import TrainConfig, config_from_dict
from tests.workloads.launch import JobOutcome, run_worlds

GPT = {"kind": "gpt", "layers": 2, "heads": 4, "dim": 32, "seq_len": 32}
MLP = {"kind": "mlp", "hidden": [32, 32]}
STEPS = 4


def job(model: dict, layout: dict, ckpt_dir: str, precision: str = "fp32",
        steps: int = STEPS, optimizer: str = "sgd", interval: int = 0) -> TrainConfig:
    # SGD: its update is proportional to the gradient, so a gradient summed instead of averaged
    # (or taken from the wrong samples) changes the next loss; Adam would hide a scale error.
    lr = 0.2 if optimizer == "sgd" else 3e-3
    return config_from_dict({
        "model": model, "layout": layout,
        "train": {"steps": steps, "batch_size": 8, "log_every": 1, "precision": precision,
                  "optimizer": optimizer, "lr": lr},
        "checkpoint": {"dir": ckpt_dir, "interval": interval},
        "resources": {"devices": "cpu"},
    })


@dataclass
class Worlds:
    configs: dict[str, TrainConfig]
    outcomes: dict[str, JobOutcome]


# name -> (model, layout, precision). The first entry of each model/precision is its reference.
LAYOUTS = {
    "gpt-single": (GPT, {}, "fp32"),
    "gpt-dp2-ddp": (GPT, {"dp": 2}, "fp32"),
    "gpt-dp2-fsdp": (GPT, {"dp": 2, "data_parallel": "fsdp"}, "fp32"),
    "gpt-tp2": (GPT, {"tp": 2}, "fp32"),
    "gpt-pp2-gpipe": (GPT, {"pp": 2, "pipeline_schedule": "gpipe"}, "fp32"),
    "gpt-pp2-1f1b": (GPT, {"pp": 2, "pipeline_schedule": "1f1b"}, "fp32"),
    "gpt-dp2-tp2-fsdp": (GPT, {"dp": 2, "tp": 2, "data_parallel": "fsdp"}, "fp32"),
    "gpt-dp2-pp2-ddp": (GPT, {"dp": 2, "pp": 2}, "fp32"),
    "gpt-dp2-pp2-fsdp": (GPT, {"dp": 2, "pp": 2, "data_parallel": "fsdp"}, "fp32"),
    "gpt-pp2-tp2": (GPT, {"pp": 2, "tp": 2}, "fp32"),
    "mlp-single": (MLP, {}, "fp32"),
    "mlp-tp2": (MLP, {"tp": 2}, "fp32"),
    "mlp-pp2": (MLP, {"pp": 2}, "fp32"),
    "mlp-dp4-fsdp": (MLP, {"dp": 4, "data_parallel": "fsdp"}, "fp32"),
    "gpt-single-bf16": (GPT, {}, "bf16"),
    "gpt-tp2-bf16": (GPT, {"tp": 2}, "bf16"),
    "gpt-dp2-fsdp-bf16": (GPT, {"dp": 2, "data_parallel": "fsdp"}, "bf16"),
    "gpt-single-fp16": (GPT, {}, "fp16"),
    "gpt-dp2-ddp-fp16": (GPT, {"dp": 2}, "fp16"),
    "gpt-dp2-fsdp-fp16": (GPT, {"dp": 2, "data_parallel": "fsdp"}, "fp16"),
}


@pytest.fixture(scope="session")
def worlds(tmp_path_factory: pytest.TempPathFactory) -> Worlds:
    root = tmp_path_factory.mktemp("worlds")
    configs = {name: job(model, layout, str(root / name), precision)
               for name, (model, layout, precision) in LAYOUTS.items()}
    # Resume: 8 steps straight; 4 steps then 4 more from its checkpoint (same layout); and
    # 4 steps with dp 2 (FSDP) then 4 more with dp 1 from that checkpoint (resharded).
    resume = {
        "straight": job(MLP, {"dp": 2}, str(root / "straight"), steps=8, optimizer="adamw",
                        interval=4),
        "first-half": job(MLP, {"dp": 2}, str(root / "halves"), steps=4, optimizer="adamw"),
        "second-half": job(MLP, {"dp": 2}, str(root / "halves"), steps=8, optimizer="adamw"),
        "fsdp-half": job(MLP, {"dp": 2, "data_parallel": "fsdp"}, str(root / "shrink"), steps=4,
                         optimizer="adamw"),
        "dp1-rest": job(MLP, {}, str(root / "shrink"), steps=8, optimizer="adamw"),
    }
    configs.update(resume)
    names = list(configs)
    outcomes = run_worlds([configs[n] for n in names])
    return Worlds(configs, dict(zip(names, outcomes)))
