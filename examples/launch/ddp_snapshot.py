"""A plain DDP training script, written for torchrun (nothing in it knows hetflow).

    torchrun --standalone --nproc_per_node 2 examples/launch/ddp_snapshot.py --steps 200
    hetflow launch --nproc 2 examples/launch/ddp_snapshot.py --steps 200
    hetflow launch --nproc 2 --max-restarts 2 examples/launch/ddp_snapshot.py --snapshot /tmp/snap.pt

A small regression MLP on synthetic data (fixed seeds: the same loss curve for the same world
size, under any launcher). With ``--snapshot PATH`` it saves a snapshot every ``--save-every``
steps (written to a temporary file, then renamed) and resumes from it when it starts again, as
PyTorch's fault-tolerant DDP tutorial does. Prints ``step N loss X`` on rank 0 every
``--log-every`` steps, a ``throughput ...`` line and ``final loss X`` at the end.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--snapshot", default=None)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="pause per step (s)")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden),
                          nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if args.snapshot and os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=device)
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        start = snap["step"]
        mean = snap.get("loss", float("nan"))  # the loss of the snapshot's last step
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)

    true_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(1))
    t_warm = None
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(args.batch, 32, generator=g)
        y = torch.sin(x @ true_w) + 0.1 * torch.randn(args.batch, 1, generator=g)
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = float(mean) / world
        if step + 1 == start + args.warmup:
            t_warm = time.time()
        if rank == 0 and ((step + 1) % args.log_every == 0 or step == start):
            print(f"step {step + 1} loss {mean:.6f}", flush=True)
        if args.snapshot and rank == 0 and (step + 1) % args.save_every == 0:
            tmp = args.snapshot + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1, "loss": mean}, tmp)
            os.replace(tmp, args.snapshot)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        if t_warm is not None and args.steps > start + args.warmup:
            done = args.steps - start - args.warmup
            rate = done * args.batch * world / (time.time() - t_warm)
            print(f"throughput {rate:.1f} samples/s", flush=True)
        print(f"final loss {mean:.6f}", flush=True)
    dist.barrier()  # every rank done with the group before any tears it down (see fsdp2.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
