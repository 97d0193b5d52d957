"""The checkpoint's tokenizer files copied into a bundle: regular files only, none through a
link out of the checkpoint, a chat template within its size bound."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from mobius_genai.bundle.chat_template import CHAT_TEMPLATE_FILES, check_template_file
from mobius_genai.checkpoint.source import TOKENIZER_FILES, checkpoint_file
from mobius_genai.errors import BundleError, ConfigError

__all__ = ["TOKENIZER_FILES", "copy_tokenizer_files"]


def copy_tokenizer_files(source: Path, bundle: Path) -> list[str]:
    """Copy the TOKENIZER_FILES that `source` has into `bundle`; returns the names copied.

    Only regular files are copied: a symbolic link that leads out of the checkpoint (which could
    ship /etc/passwd or a key as special_tokens_map.json; `source.checkpoint_file`), a pipe or a
    folder under one of these names is refused. A link that stays inside it (a huggingface_hub
    cache snapshot's link into its repository's blobs/ folder) is copied as the file it names.
    A failed copy (disk full, no inodes left) is a BundleError naming the file; a chat template
    above its size bound (`size_limits.CHAT_TEMPLATE_BYTES`) a ConfigError.
    """
    copied = []
    for name in TOKENIZER_FILES:
        path = source / name
        if not os.path.lexists(path):
            continue
        origin = checkpoint_file(path, source, BundleError)
        try:
            _copy_regular(origin, bundle / name)
        except _NotRegular as error:
            raise BundleError(
                f"{name}: not a regular file ({error}) in {source}; accepted: regular files in "
                "the checkpoint folder"
            ) from None
        except OSError as error:
            raise BundleError(
                f"{name}: cannot copy it into the bundle ({error.strerror or error}); accepted: "
                "a readable file, and an output folder on a disk with free space and inodes"
            ) from error
        copied.append(name)
        if name in CHAT_TEMPLATE_FILES:
            check_template_file(bundle / name, str(path), ConfigError)
    return copied


class _NotRegular(Exception):
    """A tokenizer file that is not a regular file (its kind is the message)."""


def _copy_regular(origin: Path, destination: Path) -> None:
    """Copy `origin`, which must be a regular file when opened (no link swapped in meanwhile)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    descriptor = os.open(origin, flags)
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise _NotRegular("a folder" if stat.S_ISDIR(mode) else "a pipe, socket or device")
    with open(descriptor, "rb") as reader:
        created = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(created, "wb") as writer:
            shutil.copyfileobj(reader, writer)
