"""One line for every failure of a command that writes output, not only for MobiusErrors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from mobius_genai.errors import BundleError, MobiusError


@contextlib.contextmanager
def reported_as_errors(action: str) -> Iterator[None]:
    """MobiusErrors pass; an OSError (a full disk, a permission, a vanished file) becomes a
    BundleError and any other exception a MobiusError, both saying `action` failed and why.

    The CLI prints them as one line (--debug shows the traceback of the cause).
    """
    try:
        yield
    except MobiusError:
        raise
    except OSError as error:
        raise BundleError(f"{action} failed: {error}") from error
    except Exception as error:
        raise MobiusError(f"{action} failed: {type(error).__name__}: {error}") from error
