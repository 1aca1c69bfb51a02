"""The gateway's count of streamed answers in flight (``gateway.CountedStream``), which its queue
limit reads: it must start when a stream is admitted (not at its first token, or a burst of
streams passes the check together) and end exactly once however the stream ends."""

from __future__ import annotations

import asyncio
import gc

import pytest

from hetflow.workloads.serve.gateway import CountedStream


async def _tokens(n: int, fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("replica lost")
        await asyncio.sleep(0)
        yield i


def test_counted_from_admission_to_the_last_token() -> None:
    inflight = {"d": 0}

    async def run() -> list[int]:
        streams = [CountedStream(inflight, "d", _tokens(3)) for _ in range(4)]
        assert inflight["d"] == 4  # admitted, before any token: a burst is counted at once
        got = [t async for t in streams[0]]
        assert inflight["d"] == 3
        for s in streams[1:]:
            async for _ in s:
                pass
        return got

    assert asyncio.run(run()) == [0, 1, 2] and inflight["d"] == 0


def test_released_once_on_error_close_and_when_dropped_unread() -> None:
    inflight = {"d": 0}

    async def run() -> None:
        failing = CountedStream(inflight, "d", _tokens(5, fail_at=2))
        with pytest.raises(RuntimeError):
            async for _ in failing:
                pass
        assert inflight["d"] == 0
        with pytest.raises(StopAsyncIteration):  # read again after its end: no second release
            await failing.__anext__()
        closed = CountedStream(inflight, "d", _tokens(5))
        await closed.__anext__()
        await closed.aclose()
        await closed.aclose()
        assert inflight["d"] == 0
        CountedStream(inflight, "d", _tokens(5))  # the client left before the first byte
        gc.collect()
        assert inflight["d"] == 0

    asyncio.run(run())
