"""Kernels as data: ep/kernels.py's table, EpCapabilities.kernels, the gates that read them."""

from __future__ import annotations

import dataclasses
import re

import onnx_ir as ir
import pytest

from mobius_genai.cli import main
from mobius_genai.cli._eps import format_kernel_table
from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.ep import BUILTIN_EPS, EpCapabilities, ep_registry, get_ep, register_ep
from mobius_genai.ep.kernels import KERNELS, ep_runs, missing
from mobius_genai.optimize import FUSIONS, LOWERINGS, optimize_model
from mobius_genai.optimize.gates import GateInput
from tests.optimize._graphs import op_counts, tiny_config, tiny_decoder

F32, F16, BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16
GROUPS = {group.name: group for group in (*FUSIONS, *LOWERINGS)}


def _gate(caps: EpCapabilities, group: str, dtype: ir.DataType = F32) -> str | None:
    return GROUPS[group].gate(GateInput(caps, dtype, "decoder"))


@pytest.fixture
def kernel_ep(monkeypatch: pytest.MonkeyPatch) -> EpCapabilities:
    """An out-of-tree EP whose entry names kernels, registered for one test."""
    monkeypatch.setattr(ep_registry, "_entries", dict(ep_registry._entries))
    caps = EpCapabilities(
        name="kernel-ep",
        gqa_dtypes=frozenset(),
        kernels={"RMSNormalization": False, "BiasGelu": {F16}, "QMoE": True},
    )
    register_ep(caps)
    return caps


def test_every_tier1_op_is_a_row_of_the_kernel_table():
    assert set(TIER1_OPS) <= set(KERNELS)


@pytest.mark.parametrize("caps", BUILTIN_EPS, ids=lambda caps: caps.name)
def test_each_flag_reads_the_kernel_it_names(caps: EpCapabilities):
    for kernel in KERNELS.values():
        if kernel.flag is not None:
            assert getattr(caps, kernel.flag) == bool(caps.kernel_dtypes(kernel.name))


def test_a_registered_entry_s_kernels_gate_the_matching_groups(kernel_ep: EpCapabilities):
    caps = get_ep("kernel-ep")
    assert _gate(caps, "BiasGelu", F16) is None
    assert _gate(caps, "BiasGelu", F32) == "FLOAT not in kernels['BiasGelu']"
    assert _gate(caps, "SimplifiedNorm") is None  # no RMSNormalization kernel: lowered
    assert _gate(get_ep("cpu"), "SimplifiedNorm") == "supports_rms_normalization=True"
    assert caps.supports_qmoe and caps.kernel_dtypes("QMoE") == caps.model_dtypes
    assert _gate(caps.with_kernels({"BiasGelu": False}), "BiasGelu") == "no BiasGelu kernel"


def test_optimizing_for_a_registered_entry_lowers_what_its_kernels_lack(kernel_ep):
    decoder = tiny_decoder(tiny_config(num_hidden_layers=1), weights="none")[0]
    assert op_counts(decoder)["RMSNormalization"] > 0
    report = optimize_model(decoder, "kernel-ep")
    assert "SimplifiedNorm" in report.rules and "SimplifiedNorm" not in report.skipped
    assert op_counts(decoder)["RMSNormalization"] == 0


def test_kernels_named_wrongly_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"names 'Conv'; accepted: .*QMoE"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), kernels={"Conv": True})
    with pytest.raises(ValueError, match="say it with the spec's field supports_fused_moe"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), kernels={"MoE": False})
    with pytest.raises(ValueError, match=r"kernels\['QMoE'\] must hold ir.DataType"):
        EpCapabilities(name="x", gqa_dtypes=frozenset(), kernels={"QMoE": ["fp16"]})


def test_with_kernels_sets_the_spec_field_or_the_entry():
    cuda = get_ep("cuda")
    changed = cuda.with_kernels({"MoE": True, "GroupQueryAttention": {F16}, "QMoE": {F16}})
    assert changed.supports_fused_moe and changed.gqa_dtypes == {F16}
    assert changed.kernels["QMoE"] == {F16} and changed.supports_qmoe
    assert dataclasses.replace(changed, kernels=cuda.kernels).kernel_dtypes("QMoE") == set()
    with pytest.raises(ValueError, match="stated by supports_fused_moe: True or False"):
        cuda.with_kernels({"MoE": {F16}})


def test_custom_ops_off_means_no_custom_kernel_whatever_the_entry_says():
    standard = get_ep("onnx-standard")
    assert standard.supports_linear_attention  # its statement...
    assert missing(standard, "LinearAttention") == "supports_custom_ops=False"  # ...is moot
    assert not ep_runs(standard, "LinearAttention")
    assert missing(standard, "RMSNormalization") is None  # a standard op


def test_eps_kernels_prints_every_kernel_against_every_ep(capsys, kernel_ep):
    assert main(["eps", "--kernels"]) == 0
    out = capsys.readouterr().out
    assert out == format_kernel_table() + "\n"
    lines = out.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == ["kernel", *sorted(ep_registry), "without it"]
    rows = {
        cells[0]: dict(zip(header, cells, strict=True))
        for cells in (re.split(r"\s{2,}", line) for line in lines[2 : 2 + len(KERNELS)])
    }
    assert list(rows) == list(KERNELS)
    assert rows["QMoE"]["cpu"] == "all" and rows["QMoE"]["cuda"] == "-"
    assert rows["GroupQueryAttention"]["cuda"] == "fp16, bf16"
    assert rows["PackedMultiHeadAttention"]["cuda"] == "fp32, fp16"  # the op schema's dtypes
    assert rows["BiasGelu"]["kernel-ep"] == "fp16"
    assert rows["RMSNormalization"]["kernel-ep"] == "-"
    assert rows["LinearAttention"]["onnx-standard"] == "-"  # no custom ops at all
    assert rows["Shape"]["without it"] == KERNELS["Shape"].without
