"""The row type of the family table: FamilyAdapter, and FusedWeight for tensors a checkpoint
stores fused.

A row turns a config.json of its family into an ArchitectureConfig (aliases, defaults,
overrides, refused switches) and names the checkpoint tensor each graph parameter is read from
(renames, fused slices, [in, out] matrices, an optional prefix, value changes).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.checkpoint.grouped import GroupedWeight
from mobius_genai.checkpoint.weights import TensorSource, no_preprocess
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.mtp import MtpKeys
from mobius_genai.config.text_config import TextOnly
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.family_keys import drop_unread_keys
from mobius_genai.models.families.float32 import NONE_KEPT, KeptFloat32

# A config value, or a function of the (aliased) config.json dict that computes it.
ConfigValue = Any | Callable[[Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class FusedWeight:
    """Graph parameters stored as consecutive slices of one checkpoint tensor.

    `pattern` matches graph parameter names; its group `part` names the slice (one of
    `parts`, listed in storage order). `fused` is the re.sub replacement that gives the fused
    tensor's name in graph terms; it then goes through the adapter's `weight_renames`.
    `axis` is the checkpoint axis the slices are concatenated along.
    """

    pattern: str
    fused: str
    parts: tuple[str, ...]
    axis: int = 0


@dataclasses.dataclass(frozen=True)
class FamilyAdapter:
    """Differences of one model_type from the generic llama-style decoder."""

    model_type: str
    # onnxruntime-genai's model.type; its generic decoder path runs every family it does not
    # know by name, and those that it knows under another contract (gpt2) or model (chatglm).
    genai_type: str = "decoder"
    # config.json key → the standard key it stands for (transformers' attribute_map).
    config_aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Values for config.json keys that are absent or null, as transformers' config class fills them.
    config_defaults: Mapping[str, ConfigValue] = dataclasses.field(default_factory=dict)
    # ArchitectureConfig fields the family fixes (e.g. qwen2 always has q/k/v biases).
    config_overrides: Mapping[str, ConfigValue] = dataclasses.field(default_factory=dict)
    # config.json switches this package does not implement; a true value is refused.
    refused_keys: tuple[str, ...] = ()
    # (pattern, replacement) pairs applied in order to graph parameter names.
    weight_renames: tuple[tuple[str, str], ...] = ()
    # Renames applied after weight_renames whose result is read where the checkpoint lacks the
    # renamed tensor (Falcon's two parallel norms, ln_attn and ln_mlp, in the layouts that have them).
    fallback_renames: tuple[tuple[str, str], ...] = ()
    fused_weights: tuple[FusedWeight, ...] = ()
    # Regex over checkpoint names of matrices stored [in, out] (GPT-2's Conv1D).
    in_out_weights: str | None = None
    # A prefix that checkpoints saved from the base model lack ("transformer." for gpt2).
    optional_prefix: str | None = None
    # Regexes over checkpoint names of buffers that are not weights (transformers'
    # _keys_to_ignore_on_load_unexpected, e.g. GPT-2's causal mask `attn.bias`); any other
    # tensor the graph does not read is an error (weight_checks.IGNORED_TENSORS: every family).
    unused_weights: tuple[str, ...] = ()
    # Hook for value changes a family needs (e.g. norm offsets); receives the graph name.
    preprocess_weight: Callable[[str, np.ndarray, ArchitectureConfig], np.ndarray] = no_preprocess
    # Regex over graph parameter names the hook changes (None: all); the others are read as
    # stored, matrices a block at a time (weights.CheckpointTensor).
    preprocessed_weights: str | None = None
    # How the checkpoint stores MoE experts (expert_weights.py); None for dense families.
    experts: ExpertLayout | None = None
    # Linear weights stored interleaved by group in one tensor (grouped_weights.py).
    grouped_weights: tuple[GroupedWeight, ...] = ()
    # A multimodal model_type built as a bundle of its text decoder alone: the decoder's keys
    # are config.json's `text_config` (its weights' prefix is a weight rename, the other
    # graphs' tensors unused_weights).
    text_only: TextOnly | None = None
    # The keys of family_keys.FAMILY_KEYS this family's transformers class reads; config.json's
    # others are dropped before parsing, as the class ignores them.
    family_keys: frozenset[str] = frozenset()
    # Checkpoints of this family may hold a multi-token-prediction head (`mtp.*`, built as
    # mtp.onnx when config.json's keys declare it: config/mtp.py, models/mtp.py).
    mtp: MtpKeys | None = None
    # Parameters its transformers class keeps in float32 in float16 and bfloat16 models, and
    # the modules holding them compute in float32 (float32.py): a MoE router's.
    float32: KeptFloat32 = NONE_KEPT

    def text_keys(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """config.json's keys of the text decoder (`text_config`'s for a text-only row)."""
        return (
            dict(raw) if self.text_only is None else self.text_only.text_keys(raw, self.model_type)
        )

    def preprocessed(self, name: str) -> bool:
        """Whether `preprocess_weight` may change the graph parameter `name`."""
        return (
            self.preprocessed_weights is None
            or re.search(self.preprocessed_weights, name) is not None
        )

    def parse_config(self, raw: Mapping[str, Any]) -> ArchitectureConfig:
        """The ArchitectureConfig of a config.json of this family."""
        raw = self.text_keys(raw)
        for alias, key in self.config_aliases.items():
            if alias in raw and raw.get(key) is None:
                raw[key] = raw[alias]
        for key, value in self.config_defaults.items():
            if raw.get(key) is None:
                raw[key] = value(raw) if callable(value) else value
        drop_unread_keys(raw, self.family_keys)
        for key in self.refused_keys:
            if raw.get(key):
                raise UnsupportedModelError(
                    f"config.json: {key} is {raw[key]!r}; {self.model_type} models are supported "
                    f"only without it"
                )
        overrides = {
            key: value(raw) if callable(value) else value
            for key, value in self.config_overrides.items()
        }
        return ArchitectureConfig.from_dict(raw, **overrides)

    def checkpoint_name(self, graph_name: str) -> str | TensorSource:
        """The checkpoint tensor a graph parameter is read from.

        A plain name for a renamed tensor; a TensorSource when the parameter is a slice of a
        fused tensor, is stored [in, out], may lack `optional_prefix` or has a fallback name.
        """
        parts: tuple[str, ...] = ()
        axis = 0
        name = graph_name
        for fused in self.fused_weights:
            match = re.search(fused.pattern, graph_name)
            if match and match.group("part") in fused.parts:
                start, end = match.span("part")
                parts = tuple(graph_name[:start] + p + graph_name[end:] for p in fused.parts)
                name, axis = match.expand(fused.fused), fused.axis
                name = graph_name[: match.start()] + name + graph_name[match.end() :]
                break
        name = _renamed(name, self.weight_renames)
        in_out = bool(self.in_out_weights and re.search(self.in_out_weights, name))
        names = (name,)
        fallback = _renamed(name, self.fallback_renames)
        if fallback != name:
            names += (fallback,)
        prefix = self.optional_prefix
        if prefix:
            names += tuple(n[len(prefix) :] for n in names if n.startswith(prefix))
        if not (parts or in_out or len(names) > 1):
            return name
        return TensorSource(names=names, in_out=in_out, parts=parts, axis=axis)


def _renamed(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    for pattern, replacement in renames:
        name = re.sub(pattern, replacement, name)
    return name
