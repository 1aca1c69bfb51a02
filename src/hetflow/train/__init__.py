"""``import hetflow.train as train``: run a Ray-Train-style ``train_func`` on hetflow's placement.

    train.run(train_func, config=..., layout={"dp": 2}, resources={"device": "cpu"},
              checkpoint_dir="runs/x", max_failures=2)
    # inside train_func:
    train.get_context(); train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
    train.get_checkpoint()
    hetflow.train.torch.prepare_model(model), prepare_data_loader(loader), get_device()

The implementation and its contract: :mod:`hetflow.workloads.train.api`; docs/training.md
compares it with Ray Train side by side.
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

__all__ = ["Checkpoint", "Result", "TrainContext", "TrainingFailed", "get_checkpoint",
           "get_context", "report", "run"]
