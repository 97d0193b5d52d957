"""diffllama: lambda_init at each depth as transformers computes it, the layouts
DiffLlamaAttention refuses refused in one line, and the cpu graph's two attention calls per
layer (the first fused, the second over its present cache).

Logits against transformers, and the mutants (lambda_init one layer deeper, no head norm), are
test_parity.py's CASES and MUTANTS; the bundle's greedy tokens test_bundles.py's (slow).
"""

from __future__ import annotations

import pytest
from transformers.models.diffllama.modeling_diffllama import lambda_init_fn

import mobius_genai
from mobius_genai import ConfigError
from mobius_genai.models import get_family
from tests._hf import tiny_config, write_tiny_checkpoint


def test_lambda_init_of_each_depth_is_transformers():
    raw = tiny_config("diffllama", num_hidden_layers=6).to_dict()
    section = get_family("diffllama").parse_config(raw).differential_attention
    assert [section.lambda_init(i) for i in range(6)] == pytest.approx(
        [lambda_init_fn(i) for i in range(6)], abs=1e-12
    )
    assert section.head_norm


@pytest.mark.parametrize(
    ("switches", "message"),
    [
        ({"num_key_value_heads": 1}, "num_key_value_heads is 1; differential attention splits"),
        ({"attention_dropout": 0.1}, "attention_dropout is 0.1; differential attention is"),
    ],
)
def test_layouts_diffllama_refuses_are_refused_in_one_line(switches, message):
    raw = {**tiny_config("diffllama").to_dict(), **switches}
    with pytest.raises(ConfigError, match=message):
        get_family("diffllama").parse_config(raw)


def test_cpu_graph_fuses_the_cached_call_and_keeps_the_second_standard(tmp_path):
    """Per layer: GroupQueryAttention with the cache, then a standard Attention whose keys are
    that node's present keys (no past of its own), so no shared past/present buffer."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "diffllama")
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    nodes = [node for node in graph if node.op_type in ("GroupQueryAttention", "Attention")]
    assert [node.op_type for node in nodes] == ["GroupQueryAttention", "Attention"] * 3
    for fused, second in zip(nodes[::2], nodes[1::2], strict=True):
        assert len(second.inputs) <= 4 or second.inputs[4] is None  # no past key
        keys = second.inputs[1].producer().inputs[0].producer()  # Reshape ← Transpose
        assert keys.inputs[0] is fused.outputs[1]  # the fused call's present key
