"""Processes as Linux's /proc shows them: a process's state, parent, children and CPU time
(the launcher's children in tests and benchmarks)."""

import os
from typing import List, Optional

TICKS = os.sysconf("SC_CLK_TCK")


def stat(pid: int) -> Optional[List[str]]:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces): state [0],
    parent pid [1], user and system CPU ticks [11], [12]. None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def children(pid: int) -> List[int]:
    """The direct children of `pid`, from every process's parent."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and (stat(int(p)) or [None, None])[1] == str(pid)]


def running(pid: int) -> bool:
    """Not gone and not a zombie (one that has exited and waits for its reaper)."""
    s = stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS
