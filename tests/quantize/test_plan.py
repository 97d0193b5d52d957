"""Every int4 decision of a build comes out of `resolve_target`: the ops each EP takes, the
accuracy level, and the options with nothing left to fill in."""

from __future__ import annotations

import pytest

from mobius_genai import resolve_target
from mobius_genai.cli._eps import format_ep_table
from mobius_genai.ep import ep_registry, get_ep
from mobius_genai.quantize import QUALITIES, Int4Options
from mobius_genai.quantize.plan import DEQUANTIZE_LINEAR, MATMUL_NBITS

#: (EP, dtype) → (int4 matrices, quantized embedding lookup, QMoE experts, GeGLU experts a
#: MatMulNBits each, accuracy level), as the built-in EPs' kernels are: the CPU EP has
#: GatherBlockQuantized for fp32 / fp16, QMoE and "MatMulNBits.experts"; CUDA's
#: GatherBlockQuantized takes bf16 as well; DirectML has no GatherBlockQuantized;
#: TensorRT-RTX and portable ONNX have no MatMulNBits.
PLANS = {
    ("cpu", "fp32"): (MATMUL_NBITS, True, True, True, 4),
    ("cpu", "fp16"): (MATMUL_NBITS, True, True, True, 4),
    ("cuda", "fp16"): (MATMUL_NBITS, True, False, False, 0),
    ("cuda", "bf16"): (MATMUL_NBITS, True, False, False, 0),
    ("dml", "fp16"): (MATMUL_NBITS, False, False, False, 0),
    ("webgpu", "fp16"): (MATMUL_NBITS, True, False, False, 4),
    ("trt-rtx", "fp16"): (DEQUANTIZE_LINEAR, False, False, False, 0),
    ("onnx-standard", "fp32"): (DEQUANTIZE_LINEAR, False, False, False, 0),
    ("default", "fp32"): (DEQUANTIZE_LINEAR, False, False, False, 0),
}


@pytest.mark.parametrize(("ep", "dtype"), list(PLANS))
def test_each_eps_int4_ops_and_level_come_out_of_resolve_target(ep, dtype):
    plan = resolve_target(ep, dtype=dtype, precision="int4").int4_plan
    ops = (plan.matmul, plan.gather, plan.qmoe, plan.per_expert, plan.accuracy_level)
    assert ops == PLANS[ep, dtype]
    assert plan.matmul_nbits == (plan.matmul == MATMUL_NBITS)


@pytest.mark.parametrize(("ep", "expected"), [("cuda", True), ("trt-rtx", False)])
def test_the_experts_a_matmul_nbits_each_follow_the_kernel_row(ep, expected):
    """The per-expert GeGLU body is the EP's "MatMulNBits.experts" row, not its name: cpu
    without the row takes QMoE's body, an EP given it the per-expert one where it has
    MatMulNBits (not trt-rtx, whose int4 is DequantizeLinear)."""
    cpu = get_ep("cpu").with_kernels({"MatMulNBits.experts": False})
    assert not resolve_target(cpu, precision="int4").int4_plan.per_expert
    given = get_ep(ep).with_kernels({"MatMulNBits.experts": True})
    assert resolve_target(given, precision="int4").int4_plan.per_expert is expected


@pytest.mark.parametrize(
    ("ep", "int4", "expected"),
    [
        # nothing chosen: the default recipe's block size and symmetry, the EP's level
        ("cpu", Int4Options(), Int4Options(32, False, 4, "calibrated")),
        ("cuda", Int4Options(quality="builder"), Int4Options(32, True, 0, "builder")),
        # what the user chose wins
        ("cpu", Int4Options(64, True, 0, "search"), Int4Options(64, True, 0, "search")),
        ("dml", Int4Options(accuracy_level=2), Int4Options(32, False, 2, "calibrated")),
    ],
)
def test_the_plan_holds_the_int4_options_with_every_choice_filled_in(ep, int4, expected):
    target = resolve_target(ep, int4=int4)
    assert target.int4_plan.options == expected
    assert target.int4_plan.options.recipe is QUALITIES[expected.quality]
    assert target.int4_accuracy_level == target.int4_plan.accuracy_level == expected.accuracy_level


@pytest.mark.parametrize(("ep", "level"), [("cpu", 4), ("cuda", 0)])
def test_without_int4_asked_the_plan_still_says_how_stored_integers_are_written(ep, level):
    """A GGUF or GPTQ source's kept integers take the plan's ops and level, int4 asked or not."""
    target = resolve_target(ep, stored={4})
    assert target.int4_plan.options is None
    assert (target.int4_plan.matmul, target.int4_plan.accuracy_level) == (MATMUL_NBITS, level)
    assert (
        resolve_target(ep, stored={4}, int4=Int4Options(accuracy_level=1)).int4_accuracy_level == 1
    )


def test_eps_prints_each_eps_plan():
    """`mobius-genai eps` shows the plan's form and level for the EP's default dtype."""
    table = format_ep_table(wide=True).splitlines()
    for caps in ep_registry.entries():
        plan = resolve_target(caps, precision="int4").int4_plan
        row = next(line for line in table if line.split()[0] == caps.name)
        words = f"{plan.matmul}, level {plan.accuracy_level}" if plan.matmul_nbits else plan.matmul
        assert words in row
