"""The exception types a user of mobius-genai can meet.

Each says what kind of problem it is; the message names the field or file, the value found and
what is accepted. The CLI prints them as one line and exits non-zero.
"""

from __future__ import annotations


class MobiusError(Exception):
    """Base of every error mobius-genai raises on purpose."""

    def command_line_message(self) -> str:
        """The message as the CLI prints it (options named as on the command line)."""
        return str(self)


class ConfigError(MobiusError, ValueError):
    """config.json is missing, unreadable or describes an inconsistent architecture."""


class UnsupportedModelError(MobiusError, ValueError):
    """The checkpoint's architecture (model_type or a feature of it) is not supported."""


class WeightsError(MobiusError, ValueError):
    """Weight files are missing, truncated, unsafe (pickle) or do not match the architecture."""


class BundleError(MobiusError, ValueError):
    """A bundle could not be written, or an existing one fails validation."""


class OutputExistsError(BundleError):
    """The output folder exists and is not empty, and replacing it was not asked for."""

    def __init__(self, out: object) -> None:
        self.out = out
        super().__init__(self._message("force=True"))

    def command_line_message(self) -> str:
        return self._message("--force")

    def _message(self, replace: str) -> str:
        return (
            f"output {self.out}: folder exists and is not empty; accepted: a new or empty "
            f"folder, or {replace} to replace it"
        )


class ExecutionProviderError(MobiusError, ValueError):
    """The execution provider named is unknown or cannot do what was asked."""


class OptionError(MobiusError, ValueError):
    """A command-line option has a value outside the range it accepts."""
