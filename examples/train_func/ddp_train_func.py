"""A Ray Train ``train_func``, ported to hetflow by changing its imports.

    .venv/bin/python examples/train_func/ddp_train_func.py --epochs 5 --workers 2

With Ray Train it read::

    import ray.train as train
    import ray.train.torch as train_torch
    ...
    trainer = TorchTrainer(train_func, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(storage_path=..., failure_config=FailureConfig(2)))
    result = trainer.fit()

The function body is unchanged: ``train.get_context()``, ``train.get_checkpoint()``,
``train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))``,
``train_torch.prepare_model`` / ``prepare_data_loader``. hetflow places the workers with its
planner (exact devices) instead of Ray Train's first fit; see docs/training.md.
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import hetflow.train as train
import hetflow.train.torch as train_torch


def train_func(config):
    ctx = train.get_context()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    loader = train_torch.prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
    torch.manual_seed(0)
    model = train_torch.prepare_model(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
            model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        total, count = 0.0, 0
        for inputs, targets in loader:
            loss = nn.functional.cross_entropy(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + float(loss) * len(targets), count + len(targets)
        mean = torch.tensor([total / count])
        torch.distributed.all_reduce(mean)
        metrics = {"epoch": epoch, "loss": float(mean) / ctx.get_world_size()}
        with tempfile.TemporaryDirectory() as d:
            if ctx.get_world_rank() == 0:
                inner = model.module if hasattr(model, "module") else model
                torch.save({"model": inner.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(d, "state.pt"))
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
        if config.get("die_at_epoch") == epoch and ctx.attempt == 0 and ctx.get_world_rank() == 1:
            os.kill(os.getpid(), 9)  # fault injection for the tests: this worker process dies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-dir", default="runs/train-func/checkpoints")
    parser.add_argument("--die-at-epoch", type=int, default=None,
                        help="(tests) rank 1's process kills itself after this epoch, once")
    parser.add_argument("--max-failures", type=int, default=2)
    args = parser.parse_args()
    result = train.run(train_func, config={"epochs": args.epochs, "lr": args.lr,
                                           "die_at_epoch": args.die_at_epoch},
                       layout={"dp": args.workers}, resources={"devices": "auto"},
                       checkpoint_dir=args.checkpoint_dir, max_failures=args.max_failures,
                       keep_last=2, name="ddp-train-func")
    print(f"restarts: {result.restarts}")
    for m in result.metrics_history:
        print(f"epoch {m['epoch']} loss {m['loss']:.6f}")
    print(f"final loss {result.metrics['loss']:.6f}")
    print(f"checkpoint: {result.checkpoint.path if result.checkpoint else None}")


if __name__ == "__main__":
    main()
