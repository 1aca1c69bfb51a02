"""The object store size ``hetflow node start`` chooses from host memory, workload and /dev/shm."""

from __future__ import annotations

import os

import pytest

from hetflow.core.errors import InputError
from hetflow.runtime.object_store import MINIMUM_BYTES, choose_object_store_memory, dev_shm_bytes

GIB = 1 << 30
TIB = 1 << 40


@pytest.mark.parametrize(
    "host, workload, accelerators, shm, expected",
    [
        # Ray's 30% for training and tuning; more for data pipelines, less for serving
        (512 * GIB, "train", 8, None, int(512 * GIB * 0.30)),
        (512 * GIB, "tune", 8, None, int(512 * GIB * 0.30)),
        (512 * GIB, "data", 8, None, int(512 * GIB * 0.45)),
        (512 * GIB, "serve", 8, None, int(512 * GIB * 0.15)),
        (512 * GIB, None, 8, None, int(512 * GIB * 0.30)),
        # no 200 GB cap: a 2 TiB host running a data pipeline gets 45%
        (2 * TIB, "data", 8, None, int(2 * TIB * 0.45)),
        # /dev/shm caps it at 95%
        (2 * TIB, "data", 8, 256 * GIB, int(256 * GIB * 0.95)),
        # a 64 GiB host with 4 GPUs keeps 4 x 8 + 4 GiB for the workers: 30% (19.2 GiB) fits
        (64 * GIB, "train", 4, None, int(64 * GIB * 0.30)),
        # a 48 GiB host with 4 GPUs would keep 36 GiB: the store gets the remaining 12 GiB
        (48 * GIB, "data", 4, None, 12 * GIB),
        # too small for the reserve: the store keeps a tenth of host memory
        (16 * GIB, "train", 2, None, int(16 * GIB * 0.10)),
    ],
)
def test_object_store_size(host, workload, accelerators, shm, expected) -> None:
    choice = choose_object_store_memory(host, workload, accelerators=accelerators, shm_bytes=shm)
    assert choice.bytes == expected
    assert choice.ray_start_flag() == [f"--object-store-memory={expected}"]
    assert choice.describe().startswith("object store: ")


def test_reasons_say_what_limited_the_size() -> None:
    choice = choose_object_store_memory(2 * TIB, "data", accelerators=8, shm_bytes=256 * GIB)
    text = choice.describe()
    assert "45% of 2.0 TiB host memory (for data)" in text
    assert "/dev/shm (256.0 GiB)" in text and "--shm-size" in text
    lowered = choose_object_store_memory(48 * GIB, "data", accelerators=4).describe()
    assert "lowered to keep 36.0 GiB for the system and 4 accelerator workers" in lowered


def test_unknown_host_memory_leaves_rays_default() -> None:
    choice = choose_object_store_memory(None, "train")
    assert choice.bytes is None and choice.ray_start_flag() == []
    assert "Ray's default" in choice.describe()


def test_tiny_hosts_get_rays_minimum() -> None:
    assert choose_object_store_memory(200 * 1024 * 1024, "serve").bytes == MINIMUM_BYTES


@pytest.mark.parametrize("kwargs", [{"workload": "batch"}, {"accelerators": -1}, {"shm_bytes": -5}])
def test_bad_input_is_an_input_error(kwargs) -> None:
    with pytest.raises(InputError):
        choose_object_store_memory(64 * GIB, **kwargs)


def test_dev_shm_size_of_this_machine() -> None:
    if not os.path.isdir("/dev/shm"):
        assert dev_shm_bytes() is None
        return
    stat = os.statvfs("/dev/shm")
    assert dev_shm_bytes() == stat.f_blocks * stat.f_frsize
    assert dev_shm_bytes("/nonexistent/shm") is None
