"""build() / build_from_module(): API, graph contract, and errors for bad input."""

from __future__ import annotations

import json
import shutil
import time

import onnx
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import (
    ArchitectureConfig,
    ConfigError,
    ExecutionProviderError,
    UnsupportedModelError,
    build_context,
)
from mobius_genai.models import CausalLMModel
from tests.conftest import TINY_QWEN2

LLAMA_70B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
}


def test_package_is_a_mapping_and_saves_model_and_external_data(tmp_path):
    package = mobius_genai.build(TINY_QWEN2)
    assert list(package) == ["model"]
    assert isinstance(package["model"], ir.Model)
    package.save(tmp_path, progress=False)
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "model.onnx.data").is_file()
    proto = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    inputs = [i.name for i in proto.graph.input]
    outputs = [o.name for o in proto.graph.output]
    assert inputs[:2] == ["input_ids", "attention_mask"]
    assert {f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")} <= set(inputs)
    assert outputs[0] == "logits"
    assert {f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")} == set(outputs[1:])


def test_portable_graph_uses_standard_attention_ops():
    graph = mobius_genai.build(TINY_QWEN2)["model"].graph
    ops = {(n.domain, n.op_type) for n in graph}
    assert ("", "Attention") in ops and ("", "RotaryEmbedding") in ops
    assert ("", "RMSNormalization") in ops or (
        "com.microsoft",
        "SkipSimplifiedLayerNormalization",
    ) in ops
    assert all(n.domain in ("", "ai.onnx", "com.microsoft") for n in graph)


def test_tied_embeddings_share_one_weight():
    graph = mobius_genai.build(TINY_QWEN2)["model"].graph
    assert "lm_head.weight" not in graph.initializers
    table = graph.initializers["model.embed_tokens.weight"]
    assert len(table.uses()) >= 2  # the Gather and the LM head read the same table


def test_graph_only_build_of_a_70b_config_is_quick(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    started = time.perf_counter()
    package = mobius_genai.build(tmp_path, load_weights=False)
    elapsed = time.perf_counter() - started
    attention = [n for n in package["model"].graph if n.op_type == "Attention"]
    assert len(attention) == 80
    assert elapsed < 120  # generous bound: a regression to weight loading would take far longer
    weights = [
        v for v in package["model"].graph.initializers.values() if v.name.endswith(".weight")
    ]
    assert weights and all(v.const_value is None for v in weights)


def test_build_from_module_with_explicit_config():
    config = ArchitectureConfig.from_dict(
        {
            **LLAMA_70B,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
        }
    )
    with build_context("default", ir.DataType.FLOAT):
        module = CausalLMModel(config, context_length=32)
    package = mobius_genai.build_from_module(module, config)
    assert package.context_length == 32
    assert len([n for n in package["model"].graph if n.op_type == "Attention"]) == 2


def test_context_length_sizes_rotary_tables():
    package = mobius_genai.build(TINY_QWEN2, context_length=48)
    assert package.context_length == 48
    tables = [
        v for v in package["model"].graph.initializers.values() if v.name.endswith("cos_cache")
    ]
    assert tables and all(v.shape[0] == 48 for v in tables)


def test_unknown_model_type_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_70B, "model_type": "mamba9"}))
    with pytest.raises(UnsupportedModelError, match=r"'mamba9'.*supported: \[.*'llama'.*'qwen2'"):
        mobius_genai.build(tmp_path, load_weights=False)


def test_missing_config_json(tmp_path):
    shutil.copy(TINY_QWEN2 / "model.safetensors", tmp_path)
    with pytest.raises(ConfigError, match="config.json not found"):
        mobius_genai.build(tmp_path)


def test_unknown_ep_and_dtype():
    with pytest.raises(
        ExecutionProviderError, match=r"Unknown execution provider 'rocm'. Supported: \["
    ):
        mobius_genai.build(TINY_QWEN2, "rocm")
    with pytest.raises(ConfigError, match="dtype 'f8'.*fp32, fp16, bf16"):
        mobius_genai.build(TINY_QWEN2, "default", "f8")


def test_not_a_folder_nor_hub_id():
    with pytest.raises(ConfigError, match="no such folder, and not a hub id"):
        mobius_genai.build("./does/not/exist")
