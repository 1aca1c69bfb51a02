"""Processes as /proc shows them, for tests that check what a command leaves running
(independent of hetflow's own /proc reading, which those tests check)."""

from __future__ import annotations

import os
from pathlib import Path


def stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat after the command: state, ppid, pgrp, ... (raises OSError when gone)."""
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()


def alive(pid: int) -> bool:
    """Running (a zombie has ended)."""
    try:
        return stat_fields(pid)[0] != b"Z"
    except OSError:
        return False


def parent_of(pid: int) -> int:
    return int(stat_fields(pid)[1])


def nice_of(pid: int) -> int:
    return int(stat_fields(pid)[16])


def group_of(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = stat_fields(int(name))
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                out.append(int(name))
    return out


def named_with_env(comm: bytes, entry: str) -> list[int]:
    """Live processes called ``comm`` (/proc/PID/comm) whose environment holds ``entry``
    (``NAME=value``): e.g. the HAProxy of one ``hetflow serve``, marked by a variable given to it."""
    mark = entry.encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if Path(f"/proc/{name}/comm").read_bytes().strip() != comm:
                    continue
                env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mark in env:
                out.append(int(name))
    return out
