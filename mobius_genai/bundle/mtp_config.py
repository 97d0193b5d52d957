"""genai_config's `model.mtp` section, as onnxruntime-genai 0.18 parses it (src/config.cpp's
Mtp_Element; its builder's `qwen_mtp.py` writes the same), and the head's own config.

og's MtpGenerator takes the head as a second og.Model, and og's Python API has no loader for
the section: `head_overlay` is the overlay (`og.Config.overlay`) of the bundle's genai_config
whose decoder is the head, derived from the section alone, so any bundle with one (ours or the
builder's) opens the same way. Pure data: read by validate and the runtime too.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from mobius_genai.kinds.og_types import OG_SECTIONS

#: The draft tokens per round og.MtpGenerator chains by default (`max_draft_tokens`).
DRAFT_TOKENS = 4
#: The decoder output the head reads, and the head's inputs and outputs (og's defaults).
MAIN_HIDDEN_STATES = "hidden_states"
MTP_INPUTS, MTP_OUTPUTS = OG_SECTIONS["mtp"]
POSITION_IDS = "position_ids"
#: The keys of an `mtp` section og's decoder section takes too (not `main_hidden_states`, nor
#: the `enabled` switch og's builder writes).
_DECODER_KEYS = frozenset(
    {
        "filename",
        "num_hidden_layers",
        "num_key_value_heads",
        "head_size",
        "inputs",
        "outputs",
        "session_options",
        "run_options",
        "shared_initializers",
    }
)


def mtp_section(
    decoder: Mapping[str, Any], filename: str, head_inputs: Collection[str]
) -> dict[str, Any]:
    """The `mtp` section of a head in `filename` whose graph has `head_inputs`, beside the
    genai_config `decoder` section (its attention sizes and session options are the decoder's;
    one layer)."""
    inputs = dict(MTP_INPUTS)
    if POSITION_IDS in head_inputs:
        inputs[POSITION_IDS] = POSITION_IDS
    return {
        "filename": filename,
        "num_hidden_layers": 1,
        "num_key_value_heads": decoder["num_key_value_heads"],
        "head_size": decoder["head_size"],
        "main_hidden_states": MAIN_HIDDEN_STATES,
        "inputs": inputs,
        "outputs": dict(MTP_OUTPUTS),
        "session_options": json.loads(json.dumps(decoder.get("session_options", {}))),
    }


def with_mtp(config: dict[str, Any], filename: str, head_inputs: Collection[str]) -> dict[str, Any]:
    """`config` (a decoder's genai_config) with the decoder's hidden-states output declared
    and an `mtp` section for the head in `filename` (whose graph has `head_inputs`)."""
    decoder = config["model"]["decoder"]
    decoder["outputs"]["hidden_states"] = MAIN_HIDDEN_STATES
    config["model"]["mtp"] = mtp_section(decoder, filename, head_inputs)
    return config


def head_overlay(config: Mapping[str, Any]) -> dict[str, Any]:
    """The overlay of genai_config `config` (which has an `mtp` section) that makes its decoder
    the head: og opens that as the MtpGenerator's second model."""
    section = config["model"]["mtp"]
    head = {key: value for key, value in section.items() if key in _DECODER_KEYS}
    head["inputs"] = {**MTP_INPUTS, **section.get("inputs", {})}
    head["outputs"] = {**MTP_OUTPUTS, **section.get("outputs", {})}
    return {"model": {"decoder": head}}
