"""Wall time and peak memory of a command, its child processes included (Linux /proc).

Peak RSS is the largest sum of the resident set sizes of the command's process tree, sampled
every few milliseconds, and at least the largest single process's peak that the kernel reports
(`ru_maxrss` of wait4), so a spike between two samples in one process is not missed. The
sampled peaks of the command's own process and of its largest descendant (e.g. `package`'s
smoke test process) are reported apart too.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclasses.dataclass(frozen=True)
class Measured:
    """What one run of a command cost."""

    wall_s: float
    peak_rss_mib: float
    returncode: int
    output: str
    command_peak_mib: float = 0.0
    """Sampled peak RSS of the command's own process."""
    descendant_peak_mib: float = 0.0
    """Largest sampled peak RSS of any one process the command started."""
    cpu_s: float = 0.0
    """User + system CPU time of the command and the descendants it waited for (on a loaded
    machine, steadier than the wall time)."""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stream:
                stat = stream.read()
        except OSError:
            continue
        # The command name (field 2) is in parentheses and may contain spaces.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as stream:
            return int(stream.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(root: int) -> int:
    """Sum of the RSS of `root` and all its descendants now."""
    return sum(tree_rss_by_pid(root).values())


def tree_rss_by_pid(root: int) -> dict[int, int]:
    """RSS of `root` and of each of its descendants now, by pid."""
    tree = _children()
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        found[pid] = _rss_bytes(pid)
        stack.extend(tree.get(pid, ()))
    return found


def run_measured(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    interval_s: float = 0.01,
    sync_first: bool = True,
) -> Measured:
    """Run `command` to completion; its wall time and the peak RSS of its process tree.

    With `sync_first`, dirty pages of earlier runs are flushed before the clock starts, so one
    build does not pay for writing back another's output.
    """
    if sync_first:
        os.sync()
    started = time.perf_counter()
    process = subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
    )
    peak = 0
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            now = tree_rss_by_pid(process.pid)
            peak = max(peak, sum(now.values()))
            for pid, rss in now.items():
                peaks[pid] = max(peaks.get(pid, 0), rss)
            done.wait(interval_s)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(process.stdout.read()), daemon=True)
    reader.start()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    reader.join()
    process.returncode = os.waitstatus_to_exitcode(status)
    peak = max(peak, usage.ru_maxrss * 1024)
    own = peaks.pop(process.pid, 0)  # wait4's ru_maxrss mixes in the descendants' peaks
    output = b"".join(chunks).decode(errors="replace")
    return Measured(
        wall,
        peak / 2**20,
        process.returncode,
        output,
        command_peak_mib=own / 2**20,
        descendant_peak_mib=max(peaks.values(), default=0) / 2**20,
        cpu_s=usage.ru_utime + usage.ru_stime,
    )


def folder_mib(folder: str | Path) -> float:
    """Total size of the files under `folder`, in MiB."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) / 2**20
