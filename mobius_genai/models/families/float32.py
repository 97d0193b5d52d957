"""Parameters a family's transformers class keeps in float32 whatever the model's dtype.

transformers loads the parameters its class names in `_keep_in_fp32_modules_strict` in float32
for float16 and bfloat16 models, and those in `_keep_in_fp32_modules` for float16 ones
(`PreTrainedModel._get_dtype_plan`), and the modules holding them compute in float32: a MoE
router's logits, scores, correction and top-k choice (DeepseekV3TopkRouter). A row lists them
in `FamilyAdapter.float32` as transformers does (patterns searched in checkpoint names), with
the buffers its class declares float32 (LFM2-MoE's `expert_bias`). The build stores the
matching parameters in float32 (read from the checkpoint as float32: a float32 correction
bias exactly), and a component whose parameters are float32 computes in float32 and casts its
output back to the graph's dtype (components/group_router.py). Int4 leaves them float, in
every dtype (a float32 build's too): each carries `KEPT_FLOAT32` (quantize/weight_uses.py
reads it), for a router's choice is as sensitive to 4-bit rounding as to float16's. Arithmetic in float32 around
parameters kept in the model's dtype is the component's config (MiniMax-M2's router scores:
`GroupRouting.float32_scores`). A float32 build has nothing to change.

gpt_oss's and afmoe's RMSNorm weights (`_keep_in_fp32_modules`: float16 models) are not kept: the graph's
RMSNormalization normalizes in float32 already, the hub's bfloat16 weights (within float16's
range) are exact in float16, and a float32 weight between Casts would cost the residual Add + RMSNormalization
fusion (SkipSimplifiedLayerNormalization) of every layer on every EP. Flint's attention sinks
(`_keep_in_fp32_modules_strict`) are not kept either: one logit per head, which float16 holds
to 1e-3 of its value, and GroupQueryAttention takes sinks only in the graph's dtype, so float32
ones would cost every layer its fusion. Kimi Linear's `dt_bias` (`_keep_in_fp32_modules_strict`)
and OLMo hybrid's `A_log` (created float32) are not kept yet: the delta-rule block computes its
gates in the graph's dtype, so a float16 build rounds them (float32 builds are exact; a known
gap, tests/models/families/test_float32.py's NOT_KEPT and NOT_DECLARED).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.checkpoint.reader import KEPT_FLOAT32, TensorSource
from mobius_genai.ep.context import get_build_dtype


@dataclasses.dataclass(frozen=True)
class KeptFloat32:
    """A transformers class's float32 parameters, as patterns it searches in their names."""

    strict: tuple[str, ...] = ()
    """`_keep_in_fp32_modules_strict`: float32 in float16 and bfloat16 models."""
    in_float16: tuple[str, ...] = ()
    """`_keep_in_fp32_modules`: float32 in float16 models only."""
    declared: tuple[str, ...] = ()
    """Buffers the class declares float32 whatever the model's dtype, which loading leaves
    float32 (LFM2-MoE's `expert_bias`): as `strict`."""

    def patterns(self, dtype: ir.DataType) -> tuple[str, ...]:
        """The patterns that apply to a graph built in `dtype`."""
        always = self.strict + self.declared
        if dtype == ir.DataType.FLOAT16:
            return always + self.in_float16
        return always if dtype == ir.DataType.BFLOAT16 else ()

    def unquantized(self, dtype: ir.DataType) -> tuple[str, ...]:
        """The patterns int4 leaves float in a graph built in `dtype`: those the dtype keeps,
        and in a float32 graph those any narrow dtype would (`strict`, `declared`)."""
        return self.patterns(ir.DataType.BFLOAT16 if dtype == ir.DataType.FLOAT else dtype)


#: A class that keeps nothing in float32 (most).
NONE_KEPT = KeptFloat32()
#: DeepSeek-V3's router (DeepseekV3TopkRouter) and the classes that copy it: its weight and
#: its choice's correction bias.
CORRECTED_ROUTER = KeptFloat32(strict=("e_score_correction_bias", "gate.weight"))
#: DeepSeek-V2's router: its weight (no correction bias).
ROUTER = KeptFloat32(strict=("gate.weight",))
_NARROW = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def keep_float32(
    module: nn.Module, kept: KeptFloat32, checkpoint_name: Callable[[str], str | TensorSource]
) -> None:
    """Make the parameters of `module` that `kept` names float32 in the build dtype's graph
    (before its weights are read and its graph is built), and mark those int4 leaves float
    (`KeptFloat32.unquantized`) with `KEPT_FLOAT32`. Patterns are searched in the checkpoint
    tensor's name (`checkpoint_name` of the parameter's) and in the parameter's own: the
    names transformers searches are its modules', which a hub checkpoint may store under
    others its conversion mapping renames (Hy3's `mlp.expert_bias`, Flint's
    `self_attn.softmax_offset`), and which our graph's names follow."""
    dtype = get_build_dtype()
    patterns = kept.unquantized(dtype)
    if not patterns:
        return
    narrow = set(kept.patterns(dtype))
    for name, value in module.named_parameters():
        source = checkpoint_name(name)
        stored = source if isinstance(source, str) else source.names[0]
        found = [p for p in patterns if _search(p, stored) or _search(p, name)]
        if not found:
            continue
        value.meta[KEPT_FLOAT32] = True
        if narrow.intersection(found) and value.dtype in _NARROW:
            value.type = ir.TensorType(ir.DataType.FLOAT)


def _search(pattern: str, name: str) -> bool:
    """transformers' build_glob_alternation: "*" is any run, the rest a regex searched."""
    return re.search(pattern.replace("*", ".*"), name) is not None
