"""Open a bundle for `run`, `chat` and `bench`: one path, so the three say the same thing when
a bundle cannot run here or is damaged.

Before loading: a path that does not exist or is not a bundle, a graph whose dtype the CPU
provider lacks (`placement`). While loading and generating, onnxruntime-genai's failures become
one line: a provider this onnxruntime-genai lacks names the wheel that runs the bundle and
`--ep cpu` (`placement`); anything else is checked by `validate` (the graph without its weights,
no checksums: seconds), whose finding is said instead of onnxruntime's internals, with the
command that checks the whole bundle. onnxruntime's own log lines are silenced, and
onnxruntime-genai's warnings turned off: what they say reaches the user once, in that line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnxruntime_genai as og

from mobius_genai._signals import threads_leave_signals_to_main
from mobius_genai.bundle._og_errors import og_error_line
from mobius_genai.bundle.bundle_folder import require_bundle
from mobius_genai.bundle.validate import read_genai_config, validate_bundle
from mobius_genai.errors import BundleError
from mobius_genai.runtime.adapters import ActiveAdapter, load_adapter
from mobius_genai.runtime.generate import load_model
from mobius_genai.runtime.placement import Provider, missing_provider, require_runnable

#: What `--ep cpu` asks for: the bundle's graph on onnxruntime's CPU provider.
ON_CPU: Provider = (None, {})
#: onnxruntime's log severity of every session opened here: fatal only (4), so an error
#: reaches the user once, in mobius-genai's line, not also as a red log line.
_QUIET_SESSIONS = {"log_severity_level": 4}


def thread_options(threads: int | None) -> dict[str, int]:
    """onnxruntime session options giving it `threads` intra-op threads (and one inter-op
    thread); none for None (onnxruntime's own choice)."""
    return {} if threads is None else {"intra_op_num_threads": threads, "inter_op_num_threads": 1}


@dataclasses.dataclass(frozen=True)
class OpenBundle:
    """A loaded bundle and what the commands that run it read: its genai_config, and the
    command it was opened for (named in advice such as `--ep cpu`)."""

    folder: Path
    config: Mapping[str, Any]
    model: og.Model
    command: str
    adapter: ActiveAdapter | None = None
    """The LoRA adapter every generation runs with (`--adapter`), None for the base model."""
    mtp: og.Model | None = None
    """The bundle's MTP head, og.MtpGenerator's draft model (runtime/mtp.py); None without one
    or with `--no-mtp`."""

    @property
    def context_length(self) -> int:
        """The tokens the bundle's graph holds (model.context_length)."""
        return int(self.config["model"]["context_length"])

    @property
    def default_max_length(self) -> int:
        """The bundle's own limit of prompt plus generated tokens (search.max_length)."""
        return int(self.config.get("search", {}).get("max_length", self.context_length))

    def failure(self, doing: str, error: BaseException) -> BundleError:
        """`error`, raised by onnxruntime-genai while it was `doing` something, as one line."""
        return failure(self.folder, self.config, self.command, doing, error)


def open_bundle(
    folder: str | Path,
    *,
    command: str,
    provider: Provider | None = None,
    threads: int | None = None,
    search: Mapping[str, Any] | None = None,
    adapter: str | None = None,
    mtp: bool = True,
) -> OpenBundle:
    """The bundle in `folder`, loaded for `command` (`run`, `chat`, `bench`) on its own
    providers, or on `provider` instead; `threads` sets onnxruntime's intra-op threads, and
    `search` (onnxruntime-genai's search options: do_sample, temperature, top_p, top_k,
    random_seed) overrides the bundle's search settings for every request and generator;
    `adapter` names the LoRA adapter every generation runs with (runtime/adapters.py); a
    bundle with an MTP head decodes with it (`mtp=False`: without, `--no-mtp`), unless an
    adapter is active (og.MtpGenerator takes none)."""
    require_bundle(folder)
    folder = Path(folder)
    config = read_genai_config(folder)  # its shape checked before og parses it
    require_runnable(folder, config, provider)
    og.set_log_options(warning=False)
    options = {**_QUIET_SESSIONS, **thread_options(threads)}
    try:
        with threads_leave_signals_to_main():
            model = load_model(folder, provider=provider, session_options=options, search=search)
            head = None
            if mtp and adapter is None and "mtp" in config["model"]:
                head = load_model(folder, provider=provider, session_options=options, mtp_head=True)
    except BundleError as error:
        raise failure(folder, config, command, "load the bundle", error) from error.__cause__
    active = None if adapter is None else load_adapter(folder, model, adapter)
    return OpenBundle(folder, config, model, command, active, head)


def failure(
    folder: Path, config: Mapping[str, Any], command: str, doing: str, error: BaseException
) -> BundleError:
    """One line for onnxruntime-genai's `error` (or a BundleError made of it) while `doing`:
    the wheel a missing provider needs, else what `validate` finds wrong with the bundle, else
    og's own message without onnxruntime's internals; both name `mobius-genai validate`."""
    cause = error.__cause__ if isinstance(error, BundleError) and error.__cause__ else error
    said = missing_provider(folder, config, str(cause), command)
    if said is not None:
        return BundleError(said)
    check = f"`mobius-genai validate {folder}`"
    finding = _validation_finding(folder)
    if finding is not None:
        return BundleError(
            f"{folder}: onnxruntime-genai cannot {doing}; the bundle is damaged: {finding} "
            f"({check} checks it all)"
        )
    return BundleError(
        f"{folder}: cannot {doing}: {og_error_line(cause)}; {check} checks the bundle"
    )


def _validation_finding(folder: Path) -> str | None:
    """What `validate` finds wrong with the bundle (checksums not computed), None if nothing."""
    try:
        validate_bundle(folder, check_hashes=False)
    except BundleError as problem:
        return str(problem).removeprefix(f"bundle {folder}: ")
    return None
