"""mobius_manifest.json: how a bundle was made, and a checksum of every file in it.

The manifest makes a bundle auditable and reproducible: tool and dependency versions, the source
checkpoint (id, revision, sha256 of each file it was made from), the build settings, the rewrite
rules that fired, and the sha256 of every other bundle file, which `validate` re-checks.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import importlib.metadata
import platform
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

MANIFEST_FILENAME = "mobius_manifest.json"
MANIFEST_VERSION = 1

#: Distributions whose versions decide what a bundle contains.
DEPENDENCIES = (
    "mobius-genai",
    "onnx",
    "onnx-ir",
    "onnxscript",
    "onnxruntime",
    "onnxruntime-genai",
    "numpy",
    "safetensors",
    "ml-dtypes",
    "transformers",
)

_CHUNK = 1 << 22


class _DaemonWorker:
    """Runs submitted calls one after another in a daemon thread.

    Unlike a ThreadPoolExecutor's thread it never holds up the interpreter's exit: a package
    that failed or was interrupted exits at once, and Ctrl-C landing between an executor
    starting its thread and registering it for shutdown left Python waiting for it forever.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[concurrent.futures.Future, Callable, tuple]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, function: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, function, args))
        return future

    def _run(self) -> None:
        while True:
            future, function, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                future.set_result(function(*args))
            except BaseException as error:
                future.set_exception(error)


_FileKey = tuple[str, int, int]
_pending: dict[_FileKey, concurrent.futures.Future[str]] = {}
_pending_lock = threading.Lock()
_hasher: _DaemonWorker | None = None
_stop = threading.Event()  # set (and replaced) by cancel_background_hashes()


def _key(path: str | Path) -> _FileKey:
    """The file's identity for a precomputed hash: resolved path, size and mtime."""
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return str(resolved), stat.st_size, stat.st_mtime_ns


def _sha256(path: str | Path, stop: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            if stop is not None and stop.is_set():
                raise concurrent.futures.CancelledError(f"hashing {path} was cancelled")
            digest.update(chunk)
    return digest.hexdigest()


def hash_in_background(paths: Iterable[str | Path]) -> None:
    """Start computing the sha256 of `paths` in a background thread.

    A later sha256_file() of the same, unchanged file (same size and mtime) takes the result
    instead of reading the file again. The packager starts the checkpoint's weight files while
    it converts them, so hashing them for the manifest overlaps with the conversion (hashlib and
    file reads release the GIL).
    """
    global _hasher
    with _pending_lock:
        if _hasher is None:
            _hasher = _DaemonWorker("sha256")
        for path in paths:
            key = _key(path)
            if key not in _pending:
                _pending[key] = _hasher.submit(_sha256, key[0], _stop)


def cancel_background_hashes() -> None:
    """Drop the background hashes nobody took: queued ones never start and a running one stops
    at its next chunk, so a failed or interrupted build does not wait for them at exit."""
    global _stop
    with _pending_lock:
        _stop.set()
        _stop = threading.Event()
        for key, future in list(_pending.items()):
            if not future.done():
                future.cancel()
                del _pending[key]


def remember_sha256(path: str | Path, digest: str) -> None:
    """Record `digest` as the sha256 of the file `path` as it is now (e.g. hashed while it was
    written); a later sha256_file() of the unchanged file takes it instead of reading it."""
    future: concurrent.futures.Future[str] = concurrent.futures.Future()
    future.set_result(digest)
    with _pending_lock:
        _pending[_key(path)] = future


def remember_source_hashes(manifest: Mapping[str, Any], source_root: Path) -> None:
    """Take the sha256 of the source files that `manifest` (made from `source_root`) lists for
    their next sha256_file(), while they are unchanged: a second bundle of the same checkpoint
    (the smoke test's twin) then does not read them again."""
    for relative, entry in manifest["source"]["files"].items():
        path = source_root / relative
        if path.is_file() and path.stat().st_size == entry["size"]:
            remember_sha256(path, entry["sha256"])


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks so a 30 GB weight file costs no memory."""
    key = _key(path)
    with _pending_lock:
        future = _pending.pop(key, None)
    if future is not None:
        digest = future.result()
        if _key(path) == key:  # unchanged while it was being hashed
            return digest
    return _sha256(path)


def file_entries(root: Path, relative_paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "size"}} for files under `root`, sorted by path."""
    return {
        relative: {"sha256": sha256_file(root / relative), "size": (root / relative).stat().st_size}
        for relative in sorted(relative_paths)
    }


def bundle_files(root: Path) -> list[str]:
    """Every file under `root` except the manifest, as POSIX paths relative to `root`."""
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file() and path.relative_to(root).as_posix() != MANIFEST_FILENAME
    )


def dependency_versions() -> dict[str, str | None]:
    """Installed version of Python and of each of DEPENDENCIES (None when not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in DEPENDENCIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def make_manifest(
    bundle: Path,
    *,
    model_id: str,
    revision: str | None,
    source_root: Path,
    source_files: Iterable[str],
    build: Mapping[str, Any],
) -> dict[str, Any]:
    """The manifest of the bundle folder `bundle` (all its files must already be written).

    `source_files` are paths relative to `source_root`; `build` is the manifest's build section
    (execution_provider, dtype, precision, context_length, model_type, optimization, ...).
    """
    versions = dependency_versions()
    return {
        "manifest_version": MANIFEST_VERSION,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": {"name": "mobius-genai", "version": versions["mobius-genai"] or "0+unknown"},
        "dependencies": versions,
        "source": {
            "model_id": model_id,
            "revision": revision,
            "files": file_entries(source_root, source_files),
        },
        "build": dict(build),
        "files": file_entries(bundle, bundle_files(bundle)),
    }
