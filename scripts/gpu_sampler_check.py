"""Check hetflow's device sampler against a real GPU: idle, then busy with work we start.

    python scripts/gpu_sampler_check.py            # about 10 s; needs a CUDA or ROCm torch
    python scripts/gpu_sampler_check.py --seconds 8 --gib 8

The sampler (``hetflow.runtime.samplers.open_sampler``: NVML, else amdsmi) reads device 0 a few
times while idle, then while this process keeps it busy with bf16 matrix products on ``cuda:0``
holding ``--gib`` GiB. Prints both readings and exits 0 only when the sampler saw what we did:
utilisation up (busy > idle, busy >= 0.5), memory used up by at least 3/4 of what we allocated,
and power read. Exit 2: no GPU visible to torch, or the sampler fell back to the CPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

GIB = 1 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to keep it busy")
    parser.add_argument("--gib", type=float, default=4.0, help="device memory to hold while busy")
    args = parser.parse_args(argv)

    import torch

    from hetflow.runtime.samplers import open_sampler

    if not torch.cuda.is_available():
        print(f"no GPU visible to torch {torch.__version__}", file=sys.stderr)
        return 2
    sampler = open_sampler()
    if sampler.source == "cpu":
        print("the sampler found no GPU library (nvidia-ml-py / amdsmi); it samples the CPU",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)

    def read(seconds: float) -> list:
        out = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(sampler.sample()[0])
            time.sleep(0.25)
        return out

    idle = read(1.5)
    stop = threading.Event()
    hold = torch.empty(int(args.gib * GIB), dtype=torch.uint8, device=device)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)

    def work() -> None:
        while not stop.is_set():
            for _ in range(20):
                a @ a
            torch.cuda.synchronize(device)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    time.sleep(1.0)  # utilisation is averaged over the driver's last sample period
    busy = read(args.seconds)
    stop.set()
    thread.join()
    del hold, a
    sampler.close()

    def summary(samples: list) -> dict:
        util = [s.utilisation for s in samples if s.utilisation is not None]
        mem = [s.memory_used_bytes for s in samples if s.memory_used_bytes is not None]
        power = [s.power_watts for s in samples if s.power_watts is not None]
        return {"utilisation": statistics.median(util) if util else None,
                "memory_used_gib": statistics.median(mem) / GIB if mem else None,
                "power_w": statistics.median(power) if power else None}

    i, b = summary(idle), summary(busy)
    name = busy[0].name
    print(f"sampler {sampler.source}, device 0 = {name}; {len(idle)} idle, {len(busy)} busy readings")
    for label, s in (("idle", i), ("busy", b)):
        print(f"  {label}: utilisation {s['utilisation']}, memory used {s['memory_used_gib']:.2f} GiB, "
              f"power {s['power_w']} W")
    problems = []
    if i["utilisation"] is None or b["utilisation"] is None:
        problems.append("no utilisation read")
    elif not (b["utilisation"] > i["utilisation"] and b["utilisation"] >= 0.5):
        problems.append("utilisation did not rise with the work")
    if i["memory_used_gib"] is None or b["memory_used_gib"] is None:
        problems.append("no memory read")
    elif b["memory_used_gib"] - i["memory_used_gib"] < 0.75 * args.gib:
        problems.append(f"memory used rose less than {0.75 * args.gib:.1f} GiB")
    if b["power_w"] is None:
        problems.append("no power read")
    if problems:
        print("sampler check FAILED: " + "; ".join(problems))
        return 1
    print("sampler check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
