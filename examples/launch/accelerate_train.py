"""Hugging Face Accelerate training, written for ``accelerate launch`` (nothing in it knows hetflow).

    accelerate launch --num_processes 2 examples/launch/accelerate_train.py --steps 30
    hetflow launch --nproc 2 examples/launch/accelerate_train.py --steps 30
    # on CPUs only (accelerate launch --cpu sets the same):
    hetflow launch --nproc 2 --env ACCELERATE_USE_CPU=1 examples/launch/accelerate_train.py

``Accelerator()`` reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) that ``accelerate launch`` sets for multi-process runs - and that ``hetflow
launch`` sets too - and picks the device (its visible GPU, else the CPU with gloo). The same
synthetic data and seeds as ``ddp_snapshot.py``: each rank's batches depend on the step alone,
so the loss curve does not depend on the launcher. Prints ``step N loss X`` and
``final loss X`` on the main process (global rank 0).
"""

import argparse

import torch
import torch.nn as nn
from accelerate import Accelerator


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32, help="per process")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    accelerator = Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)

    true_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(args.batch, 32, generator=g).to(accelerator.device)
        y = (torch.sin(x.cpu() @ true_w) + 0.1 * torch.randn(args.batch, 1, generator=g)).to(accelerator.device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        mean = accelerator.reduce(loss.detach(), reduction="mean").item()
        if accelerator.is_main_process and ((step + 1) % 10 == 0 or step == 0):
            print(f"step {step + 1} loss {mean:.6f}", flush=True)
    if accelerator.is_main_process:
        print(f"final loss {mean:.6f}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
