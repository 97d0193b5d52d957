"""The lines of gpu_check.py, as data: the tiny checkpoint each one writes, its precision, the
cuda capability fields it flips on, and the ops its cuda graph must hold.

Each line's checkpoint is one of the test fixtures (tests/_hf.py's `write_tiny_checkpoint` with
the tokenizer of tests/data/tiny-qwen2, as tests/models/families/test_bundles.py packages them, or
a vision-language fixture of `VISION`), written on the spot: nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from _random_checkpoint import BOS, EOS, TOKENIZER, TOKENIZER_FILES

GQA = "com.microsoft::GroupQueryAttention"
MOE = "com.microsoft::MoE"
QMOE = "com.microsoft::QMoE"
NBITS = "com.microsoft::MatMulNBits"
PACKED_MHA = "com.microsoft::PackedMultiHeadAttention"
CONV = "com.microsoft::CausalConvWithState"
LINEAR = "com.microsoft::LinearAttention"
ATTENTION = "ai.onnx::Attention"
SKIP_LN = "com.microsoft::SkipLayerNormalization"
BIAS_GELU = "com.microsoft::BiasGelu"
#: Not an op: a GroupQueryAttention node with causal=0 fed an attention_bias (input 10).
GQA_BIAS = f"{GQA}(causal=0, attention_bias)"

#: Logits may differ from the reference's by this much, relative to its largest logit, per
#: precision: float16 / bfloat16 rounding of the activations through three layers against
#: transformers' float32 logits on the same device; int4 (float16 activations) against the
#: same int4 graph run by onnxruntime's CPU provider (transformers' float weights are 40-75%
#: of the largest logit away from any int4 rounding of these tiny random weights).
TOLERANCE: Mapping[str, float] = MappingProxyType({"fp16": 0.02, "bf16": 0.06, "int4": 0.02})


@dataclasses.dataclass(frozen=True)
class VisionFixture:
    """A vision-language test fixture a vision line writes: tests.MODULE's WRITER(folder) writes
    the checkpoint and returns transformers' model (its vision tower is the reference)."""

    module: str
    writer: str
    image_size: tuple[int, int]
    """The image the line generates with and feeds the vision graph (height, width)."""


#: The vision-language families, by tests/ fixture. Qwen2.5-VL: 5 x 7 merged tokens in windows
#: of 2 x 2, partial at the edges. Gemma 3: at its processor's 64 x 64 (256 image tokens).
VISION: Mapping[str, VisionFixture] = MappingProxyType(
    {
        "qwen2_5_vl": VisionFixture("_qwen_vl", "write_qwen2_5_vl_checkpoint", (40, 56)),
        "gemma3": VisionFixture("_vlm", "write_gemma3_checkpoint", (64, 64)),
        # 5 x 7 merged tokens, DeepStack features beside them
        "qwen3_vl": VisionFixture("_qwen3_vl", "write_qwen3_vl_checkpoint", (40, 56)),
        # 3 x 5 image tokens in rows ended by [IMG_BREAK] / [IMG_END]
        "mistral3": VisionFixture("_mistral3", "write_mistral3_checkpoint", (24, 40)),
        # 2 x 3 tokens of 2 x 2 patches, the patch axis padded (no tiling)
        "lfm2_vl": VisionFixture("_lfm2_vl", "write_lfm2_vl_checkpoint", (16, 24)),
    }
)
#: DeepSeek-V3's latent and rope widths: MLA's one KV head in GQA is 576 wide.
_MLA_WIDTH = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
_PHI3_WINDOW = {"sliding_window": 262144, "original_max_position_embeddings": 64}
#: Only the kernels a line is about are flipped on (ep/kernels.py names); the rest of cuda's
#: capabilities stay as they are.
_MOE_FLAGS = {"MoE": True}
_QMOE_FLAGS = {"MoE": True, "QMoE": True}
_GATED_FLAGS = {"LinearAttention.gated": True}
#: Why a bundle whose GQA takes an attention_bias (image blocks, chunks) runs without capture.
_BIAS_NO_CAPTURE = (
    "GQA's attention_bias needs og's attention_mask as wide as the total length (graph capture "
    "feeds one of max_length: optimize/rules/gqa_image_blocks.py)"
)
_MAMBA2_CHECKS = "Mamba2's scan as LinearAttention update_rule gated, CausalConvWithState, GQA"
#: The speech families: tests/models/whisper/_whisper.py's layout each line writes.
SPEECH: Mapping[str, str] = MappingProxyType({"whisper": "multilingual"})


@dataclasses.dataclass(frozen=True)
class Line:
    """One line of the check: a tiny checkpoint packaged for cuda in one precision."""

    name: str
    family: str
    """tests/_hf.py's family name, or a vision-language (`VISION`) or speech (`SPEECH`) one."""
    precision: str
    checks: str
    """What the line exercises on the GPU, for the table and the README."""
    expects: tuple[str, ...]
    """Ops (domain::op) the cuda graphs must hold, else the line does not check what it says."""
    absent: tuple[str, ...] = ()
    """Ops the cuda graphs must not hold (an op the EP's gate declines for this dtype)."""
    flags: Mapping[str, bool] = dataclasses.field(default_factory=dict)
    """cuda kernels turned on for this line's build (the ones still off until checked)."""
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Config overrides of the tiny checkpoint."""
    seed: int = 3
    no_capture: str | None = None
    """Why graph capture does not apply to this bundle, where the bundle allows it."""

    @property
    def vision(self) -> VisionFixture | None:
        return VISION.get(self.family)

    @property
    def speech(self) -> str | None:
        """The Whisper fixture's layout for speech lines."""
        return SPEECH.get(self.family)

    @property
    def dtype(self) -> str:
        """The float dtype of activations (int4 lines: cuda's default, fp16)."""
        return "fp16" if self.precision == "int4" else self.precision


#: The kinds of line that run in fp16 and in bf16 alike.
_PAIRED: Mapping[str, dict[str, Any]] = {
    "dense": {"family": "qwen2", "checks": "GQA, packed q/k/v, graph capture", "expects": (GQA,)},
    "moe": {
        "family": "qwen3_moe",
        "checks": "fused com.microsoft::MoE (top-k renormalized, a dense layer between)",
        "expects": (GQA, MOE),
        "flags": _MOE_FLAGS,
    },
    "window": {
        "family": "gemma3_text",
        "checks": "GQA local_window_size 5 on sliding layers, softcap, two rope tables",
        "expects": (GQA,),
    },
    "phi3-window": {
        "family": "phi3",
        "checks": "Phi-3 style sliding_window 262144 on every attention node",
        "expects": (GQA,),
        "config": _PHI3_WINDOW,
    },
    "hybrid": {
        "family": "lfm2",
        "checks": "LFM2: CausalConvWithState between GQA layers",
        "expects": (CONV,),
    },
}


def _paired(kind: str, precision: str) -> Line:
    return Line(name=f"{kind}-{precision}", precision=precision, **_PAIRED[kind])


_FIRST = [
    _paired("dense", "fp16"),
    _paired("moe", "fp16"),
    Line(
        "qmoe-int4",
        "qwen3_moe",
        "int4",
        "com.microsoft::QMoE (int4 experts), MatMulNBits elsewhere",
        (QMOE, NBITS),
        flags=_QMOE_FLAGS,
    ),
    Line("int4", "qwen2", "int4", "MatMulNBits at accuracy level 0, fp16 activations", (NBITS,)),
    _paired("window", "fp16"),
    _paired("phi3-window", "fp16"),
    Line(
        "vision-fp16",
        "qwen2_5_vl",
        "fp16",
        "Qwen2.5-VL vision tower with com.microsoft::PackedMultiHeadAttention",
        (PACKED_MHA,),
    ),
    _paired("hybrid", "fp16"),
]
_SECOND = [
    *(_paired(kind, "bf16") for kind in ("dense", "moe", "window", "phi3-window")),
    Line(
        "vision-bf16",
        "qwen2_5_vl",
        "bf16",
        "Qwen2.5-VL vision tower in bf16: PackedMultiHeadAttention's standard body (its "
        "kernels are float and float16)",
        (),
        absent=(PACKED_MHA,),
    ),
    _paired("hybrid", "bf16"),
    Line(
        "delta-fp16",
        "qwen3_5_text",
        "fp16",
        "Qwen3.5: LinearAttention (gated delta rule) between attention layers",
        (LINEAR,),
        seed=1,
    ),
    Line(
        "gpt-oss-fp16",
        "gpt_oss",
        "fp16",
        "gpt-oss: GQA with head_sink, fused MoE with clamped SwiGLU",
        (GQA, MOE),
        flags=_MOE_FLAGS,
    ),
]
#: What landed with cuda graphs after the first two groups were written.
_THIRD = [
    Line(
        "gemma3-vision-fp16",
        "gemma3",
        "fp16",
        "Gemma 3 vision-language: the decoder's GroupQueryAttention causal=0 with the "
        "image-block attention_bias, SigLIP's tower, generation with an image",
        (GQA_BIAS,),
        no_capture=_BIAS_NO_CAPTURE,
    ),
    Line(
        "mla-fp16",
        "deepseek_v3",
        "fp16",
        "DeepSeek-V3 MLA: the latent cache in GQA, one KV head as wide as DeepSeek-V3's (512 "
        "latent + 64 rope), low-rank q, grouped sigmoid routing",
        (GQA,),
        config=_MLA_WIDTH,
    ),
    Line(
        "mamba2-fp16",
        "granitemoehybrid",
        "fp16",
        f"Granite-4.0-H: {_MAMBA2_CHECKS} (no rotary), MoE beside a shared MLP",
        (LINEAR, CONV, GQA),
        flags=_GATED_FLAGS,
    ),
    Line(
        "whisper-fp16",
        "whisper",
        "fp16",
        "Whisper: encoder and decoder graphs with ONNX Attention (cross caches, no GQA), "
        "SkipLayerNormalization, BiasGelu; og's audio processor",
        (ATTENTION, SKIP_LN, BIAS_GELU),
    ),
]
#: The kinds that landed after the third group: Llama 4's and Gemma 3n's decoders, and the
#: vision-language models whose towers have no line above.
_FOURTH = [
    Line(
        "llama4-fp16",
        "llama4_text",
        "fp16",
        "Llama 4: chunked layers as GQA causal=0 with the chunk mask as attention_bias, the NoPE "
        "layer as causal GQA (temperature tuning), L2 q/k norm, MoE scaling the expert's input",
        (GQA_BIAS, GQA),
        no_capture=_BIAS_NO_CAPTURE,
    ),
    Line(
        "gemma3n-fp16",
        "gemma3n_text",
        "fp16",
        "Gemma 3n: AltUp streams, per-layer inputs, Laurel, sparse MLPs; GQA with window 5 on "
        "sliding layers, the last two layers' GQA reading layers 2 and 3's pasts (KV sharing)",
        (GQA,),
    ),
    Line(
        "qwen3-vl-fp16",
        "qwen3_vl",
        "fp16",
        "Qwen3-VL: the tower's PackedMultiHeadAttention, DeepStack features in the image "
        "features, interleaved mrope in the decoder's GQA",
        (PACKED_MHA, GQA),
    ),
    Line(
        "mistral3-fp16",
        "mistral3",
        "fp16",
        "Mistral 3: Pixtral's tower (2-D rotary, ONNX Attention, 2 x 2 patch merge), GQA decoder",
        (ATTENTION, GQA),
    ),
    Line(
        "lfm2-vl-fp16",
        "lfm2_vl",
        "fp16",
        "LFM2-VL: SigLIP2's tower over a padded patch axis (ONNX Attention), the LFM2 decoder's "
        "CausalConvWithState and GQA",
        (ATTENTION, CONV, GQA),
    ),
]
#: Every line, most important first: a run cut short by its time budget has those.
LINES: Mapping[str, Line] = MappingProxyType(
    {line.name: line for line in _FIRST + _SECOND + _THIRD + _FOURTH}
)


def write_checkpoint(line: Line, folder: Path) -> Any:
    """Write the line's tiny checkpoint into `folder`; returns transformers' model for vision
    and speech lines (the reference), else None."""
    import sys

    sys.path.insert(0, str(TOKENIZER.parents[2]))  # the repository root: tests/ is a package
    if line.vision is not None:
        module = importlib.import_module(f"tests.{line.vision.module}")
        return getattr(module, line.vision.writer)(folder)
    if line.speech is not None:
        from tests.models.whisper._whisper import write_whisper_checkpoint, write_whisper_tokenizer

        model = write_whisper_checkpoint(folder, line.speech)
        write_whisper_tokenizer(folder, line.speech)
        return model
    from tests._hf import write_tiny_checkpoint

    write_tiny_checkpoint(
        folder,
        line.family,
        seed=line.seed,
        vocab_size=384,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=0,
        **line.config,
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, folder / name)
    return None
