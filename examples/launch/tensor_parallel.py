"""Tensor parallelism with ``parallelize_module``, written for torchrun (nothing knows hetflow).

    torchrun --standalone --nproc_per_node 2 examples/launch/tensor_parallel.py --steps 30
    hetflow launch --nproc 2 --tp 2 examples/launch/tensor_parallel.py --steps 30

A two-layer feed-forward block split Megatron-style over all ranks: the first linear by columns,
the second by rows (one all-reduce per forward). Every rank sees the same batch. With ``--tp``
hetflow puts the ranks on the fastest links it has. Prints ``step N loss X`` and ``final loss
X`` on rank 0.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.down(torch.tanh(self.up(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp_mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("tp",))

    torch.manual_seed(0)
    model = FeedForward(32, args.hidden).to(device_type)
    parallelize_module(model, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    true_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step)  # the same batch on every rank
        x = torch.randn(args.batch, 32, generator=g)
        y = torch.sin(x @ true_w) + 0.1 * torch.randn(args.batch, 1, generator=g)
        loss = nn.functional.mse_loss(model(x.to(device_type)), y.to(device_type))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and ((step + 1) % 10 == 0 or step == 0):
            print(f"step {step + 1} loss {float(loss):.6f}", flush=True)
    if rank == 0:
        print(f"final loss {float(loss):.6f}", flush=True)
    dist.barrier()  # every rank done with the group before any tears it down (see fsdp2.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
