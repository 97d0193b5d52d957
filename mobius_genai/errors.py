"""The exception types a user of mobius-genai can meet.

Each says what kind of problem it is; the message names the field or file, the value found and
what is accepted. The CLI prints them as one line and exits non-zero.
"""

from __future__ import annotations


class MobiusError(Exception):
    """Base of every error mobius-genai raises on purpose."""


class ConfigError(MobiusError, ValueError):
    """config.json is missing, unreadable or describes an inconsistent architecture."""


class UnsupportedModelError(MobiusError, ValueError):
    """The checkpoint's architecture (model_type or a feature of it) is not supported."""


class WeightsError(MobiusError, ValueError):
    """Weight files are missing, truncated, unsafe (pickle) or do not match the architecture."""


class BundleError(MobiusError, ValueError):
    """A bundle could not be written, or an existing one fails validation."""


class ExecutionProviderError(MobiusError, ValueError):
    """The execution provider named is unknown or cannot do what was asked."""


class OptionError(MobiusError, ValueError):
    """A command-line option has a value outside the range it accepts."""
