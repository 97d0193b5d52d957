"""Reading a file hole through np.memmap costs the memory that reading data does (issue 15).

The 48-layer Qwen3-30B-A3B-shaped checkpoint leaves most experts as holes of sparse files
(make_moe_shape.py --sparse-experts). Its memory rows stand for a dense checkpoint only if the
kernel fills page cache pages for holes as it does for data. This writes a 1 GiB hole and
1 GiB of random bytes under benchmarks/_work/, drops both from the page cache, then reads each
in a fresh process the way the packager does (`np.memmap`, 64 MiB slices converted to float32)
and prints the process's RSS (file-backed part apart) and the file's pages in the page cache
(mincore) after the read. Both files are deleted after.

    python benchmarks/sparse_reads.py
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys

import numpy as np
from _random_checkpoint import WORK

SIZE = 1 << 30
_SLICE = 1 << 25  # uint16 values: 64 MiB


def _cached_mib(path: str) -> int:
    """MiB of `path` in the page cache (mincore on a mapping that touches nothing)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pages = (SIZE + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vector = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        view = (ctypes.c_char * SIZE).from_buffer(mapped)
        if libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(SIZE), vector):
            raise OSError(ctypes.get_errno(), "mincore")
        del view
    return sum(byte & 1 for byte in bytes(vector)) * mmap.PAGESIZE >> 20


def _status_mib() -> dict[str, int]:
    fields = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    with open("/proc/self/status") as status:
        pairs = (line.split(":", 1) for line in status)
        return {k: int(v.split()[0]) >> 10 for k, v in pairs if k in fields}


def read_one(path: str) -> None:
    """(Child process) read `path` fully through np.memmap; print the measures as JSON."""
    mapped = np.memmap(path, np.uint16, "r")
    total = 0.0
    for start in range(0, mapped.size, _SLICE):
        total += float(mapped[start : start + _SLICE].astype(np.float32).sum())
    print(json.dumps({**_status_mib(), "cached": _cached_mib(path), "sum": total}))


def _make(folder: str) -> dict[str, str]:
    paths = {"hole": os.path.join(folder, "hole.bin"), "random": os.path.join(folder, "data.bin")}
    with open(paths["hole"], "wb") as file:
        file.truncate(SIZE)
    rng = np.random.default_rng(0)
    with open(paths["random"], "wb") as file:
        for _ in range(SIZE // (2 * _SLICE)):
            file.write(rng.integers(0, 2**16, _SLICE, dtype=np.uint16).tobytes())
    os.sync()
    for path in paths.values():
        descriptor = os.open(path, os.O_RDONLY)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(descriptor)
    return paths


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    folder = str(WORK / "sparse-reads")
    os.makedirs(folder, exist_ok=True)
    try:
        paths = _make(folder)
        print(
            "| file (1 GiB) | on disk (MiB) | cached before (MiB) | after reading: RSS (MiB) | "
            "file-backed RSS (MiB) | peak RSS (MiB) | cached (MiB) |"
        )
        print("|---|--:|--:|--:|--:|--:|--:|")
        for kind, path in paths.items():
            disk, before = os.stat(path).st_blocks * 512 >> 20, _cached_mib(path)
            child = [sys.executable, __file__, "--read", path]
            measured = json.loads(subprocess.run(child, check=True, capture_output=True).stdout)
            print(
                f"| {kind} | {disk:,} | {before:,} | {measured['VmRSS']:,} | "
                f"{measured['RssFile']:,} | {measured['VmHWM']:,} | {measured['cached']:,} |"
            )
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--read":
        read_one(sys.argv[2])
    else:
        main()
