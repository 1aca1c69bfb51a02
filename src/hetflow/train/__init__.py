"""``import hetflow.train as train``: run a Ray-Train-style ``train_func`` on hetflow's placement.

    train.run(train_func, config=..., layout={"dp": 2}, resources={"devices": "cpu"},
              checkpoint_dir="runs/x", max_failures=2)
    # or Ray Train's trainer, unchanged but for the imports:
    from hetflow.train import RunConfig, ScalingConfig
    from hetflow.train.torch import TorchTrainer
    TorchTrainer(train_func, train_loop_config=..., scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="x", storage_path="runs")).fit()
    # inside train_func:
    train.get_context(); train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
    train.get_checkpoint()
    train.torch.prepare_model(model), prepare_data_loader(loader), get_device()

The implementation and its contract: :mod:`hetflow.workloads.train.api` and
:mod:`hetflow.workloads.train.trainer`; docs/training.md compares it with Ray Train side by side.
"""

from hetflow.workloads.train.api import (
    Checkpoint,
    Result,
    TrainContext,
    TrainingFailed,
    get_checkpoint,
    get_context,
    report,
    run,
)
from hetflow.workloads.train.trainer import (
    CheckpointConfig,
    DataParallelTrainer,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingFailedError,
)

from hetflow.train import torch  # noqa: E402,I001 - ``train.torch`` after ``import hetflow.train as train``

__all__ = ["Checkpoint", "CheckpointConfig", "DataParallelTrainer", "FailureConfig", "Result", "RunConfig",
           "ScalingConfig", "TrainContext", "TrainingFailed", "TrainingFailedError", "get_checkpoint",
           "get_context", "report", "run", "torch"]
