"""Hand-off benchmark: 1 GiB from one stage's process to another's through Ray's object store,
against a plain memory copy of the same array.

    .venv/bin/python benchmarks/handoff.py              # about 30-60 s on 2 cores
    .venv/bin/python benchmarks/handoff.py --size 256MiB --rounds 3

The workflow hands arrays between stages as Ray task results (``hetflow.workflow.runner``):
the producing stage's process writes the array into the object store once (``ray.put``, one
copy into shared memory) and the consuming stage's process maps it read-only
(``ray.get`` of a numpy array is zero-copy). Here:

* a ``Producer`` actor (stage A's process) fills a float32 array of ``--size`` (so its pages
  are touched before timing) and times ``ray.put`` of it;
* a ``Consumer`` actor (stage B's process, another process) times ``ray.get`` of the ref,
  wraps the result as a torch tensor (``torch.from_numpy``, as the training ranks take the
  prepare stage's arrays; checked to share the mapping, not copy it) and reads one value from
  each 4 KiB page through the tensor (so the mapping is really usable, not only returned), and
  checks it is the producer's data;
* **hand-off** = put time + get-and-touch time;
* **memcpy** = ``np.copyto(dst, src)`` of an array of the same size in one process, ``dst``
  pre-touched (the cheapest way to give another owner its own copy).

Round 1 is reported apart (the store's pages fault in the first time: "cold"); the RESULT uses
the median of the later rounds. The store is sized to one array plus 512 MiB, so each round
reuses the pages the previous round freed (a store with room for two arrays alternates between
two regions, and every other round is cold again). Ray copies large objects into the store with
several threads, which is why a warm put can beat a single-threaded ``np.copyto``.
Last line: ``RESULT handoff_over_memcpy=<x>`` (time ratio;
at most 1 is the goal: the hand-off costs no more than one copy).
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import ray
import torch

from hetflow.core.units import format_bytes, parse_bytes

PAGE = 4096


class Producer:
    """Stage A: makes the array and hands it off."""

    def make(self, nbytes: int, value: float) -> None:
        self.array = np.full(nbytes // 4, value, dtype=np.float32)

    def put(self) -> tuple[list, float]:
        t0 = time.perf_counter()
        ref = ray.put(self.array)
        # A ref inside a list is passed on as a ref (not resolved by Ray on the way).
        return [ref], time.perf_counter() - t0


class Consumer:
    """Stage B: takes the array."""

    def get(self, boxed: list, value: float) -> float:
        t0 = time.perf_counter()
        array = ray.get(boxed[0])
        with warnings.catch_warnings():  # read-only mapping; training only reads it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            tensor = torch.from_numpy(array)  # as the training ranks take prepared data
        touched = tensor.view(torch.uint8)[::PAGE]  # one read per page: the mapping is live
        total = int(touched.sum(dtype=torch.int64))
        elapsed = time.perf_counter() - t0
        assert array[0] == value and array[-1] == value and not array.flags.writeable
        assert tensor.data_ptr() == array.ctypes.data, "torch copied the array"
        assert total >= 0
        return elapsed


def memcpy_s(nbytes: int) -> float:
    src = np.full(nbytes // 4, 1.0, dtype=np.float32)
    dst = np.zeros_like(src)  # zeros_like may map lazily: touch it first
    dst.fill(2.0)
    t0 = time.perf_counter()
    np.copyto(dst, src)
    elapsed = time.perf_counter() - t0
    assert dst[-1] == 1.0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="array size (default 1GiB)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the first one cold")
    args = parser.parse_args()
    nbytes = parse_bytes(args.size)
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=max(nbytes + (512 << 20), 1 << 30), log_to_driver=False)
    try:
        producer = ray.remote(num_cpus=0)(Producer).remote()
        consumer = ray.remote(num_cpus=0)(Consumer).remote()
        handoffs, puts, gets, copies = [], [], [], []
        for r in range(args.rounds):
            value = float(r + 1)
            ray.get(producer.make.remote(nbytes, value))
            boxed, put_s = ray.get(producer.put.remote())
            get_s = ray.get(consumer.get.remote(boxed, value))
            del boxed  # the store may reuse the pages next round
            copy_s = memcpy_s(nbytes)
            puts.append(put_s)
            gets.append(get_s)
            handoffs.append(put_s + get_s)
            copies.append(copy_s)
            print(f"round {r + 1}: put {put_s * 1e3:7.1f} ms  get+touch {get_s * 1e3:6.2f} ms  "
                  f"hand-off {(put_s + get_s) * 1e3:7.1f} ms  np.copyto {copy_s * 1e3:7.1f} ms"
                  f"{'  (cold store)' if r == 0 else ''}", flush=True)
        warm = slice(1, None) if args.rounds > 1 else slice(0, None)
        handoff = statistics.median(handoffs[warm])
        memcpy = statistics.median(copies[warm])
        print(f"{format_bytes(nbytes)}: hand-off median {handoff * 1e3:.1f} ms (put "
              f"{statistics.median(puts[warm]) * 1e3:.1f}, get "
              f"{statistics.median(gets[warm]) * 1e3:.2f}), np.copyto median {memcpy * 1e3:.1f} ms,"
              f" cold hand-off {handoffs[0] * 1e3:.1f} ms; load average "
              f"{os.getloadavg()[0]:.2f}")
        print(f"RESULT handoff_over_memcpy={handoff / memcpy:.3f}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
