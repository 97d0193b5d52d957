"""LoRA adapters through onnxruntime-genai 0.18's own API (og.Adapters, set_active_adapter):
greedy tokens with each adapter equal transformers' PeftModel, no adapter equals the base."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_genai as og
import pytest

from mobius_genai.bundle.validate import validate_bundle
from tests.adapters.conftest import NEW_TOKENS, PROJECTIONS, PROMPT, RANKS, peft_greedy


def _generator(model: og.Model, adapters: og.Adapters | None, name: str | None) -> og.Generator:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(PROMPT) + NEW_TOKENS)
    generator = og.Generator(model, params)
    if name is not None:
        generator.set_active_adapter(adapters, name)
    generator.append_tokens(PROMPT)
    return generator


def _greedy(model: og.Model, adapters: og.Adapters | None, name: str | None) -> list[int]:
    generator = _generator(model, adapters, name)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(PROMPT) :]]


def _loaded(bundle) -> tuple[og.Model, og.Adapters]:
    model = og.Model(str(bundle))
    adapters = og.Adapters(model)
    for name in RANKS:
        adapters.load(str(bundle / "adapters" / f"{name}.onnx_adapter"), name)
    return model, adapters


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_og_greedy_with_each_adapter_equals_peft(lora_bundles, family):
    base, bundle = lora_bundles(family)
    model, adapters = _loaded(bundle)
    expected_base = peft_greedy(base.checkpoint, None, PROMPT, NEW_TOKENS)
    assert _greedy(model, None, None) == expected_base  # no adapter active: the base model
    for name in RANKS:
        expected = peft_greedy(base.checkpoint, base.adapters[name], PROMPT, NEW_TOKENS)
        assert expected != expected_base  # the adapter changes the model
        assert _greedy(model, adapters, name) == expected, name


def test_switching_adapters_between_generators(lora_bundles):
    """Three generators of one model, stepped in turn: r4, r8 and none active."""
    base, bundle = lora_bundles("qwen2")
    model, adapters = _loaded(bundle)
    names = [*RANKS, None]
    generators = [_generator(model, adapters, name) for name in names]
    tokens: list[list[int]] = [[] for _ in names]
    while not all(g.is_done() for g in generators):
        for generator, out in zip(generators, tokens, strict=True):
            if not generator.is_done():
                generator.generate_next_token()
                out.append(int(generator.get_next_tokens()[0]))
    for name, out in zip(names, tokens, strict=True):
        adapter = None if name is None else base.adapters[name]
        assert out == peft_greedy(base.checkpoint, adapter, PROMPT, NEW_TOKENS), name


def _adapter_parameters(path) -> dict[str, np.ndarray]:
    adapter = ort.AdapterFormat.read_adapter(str(path))  # owns the arrays' memory: copy them
    return {name: value.numpy().copy() for name, value in adapter.get_parameters().items()}


def test_manifest_card_and_adapter_files(lora_bundles):
    base, bundle = lora_bundles("qwen2")
    validate_bundle(bundle, check_hashes=True)  # the adapter files are hashed too
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    lora = manifest["build"]["lora"]
    assert lora["targets"] == sorted(PROJECTIONS)
    assert lora["modules"] == 3 * len(PROJECTIONS)  # three layers
    assert {name: entry["rank"] for name, entry in lora["adapters"].items()} == RANKS
    assert "adapters/r4.onnx_adapter" in manifest["files"]
    card = (bundle / "README.md").read_text()
    assert "## LoRA adapters" in card and "`adapters/r8.onnx_adapter` | 8 |" in card
    # A as [in, r], B as [r, out] with PEFT's scale alpha / r (= 2) applied, in float32
    from safetensors.numpy import load_file

    stored = load_file(str(base.adapters["r8"] / "adapter_model.safetensors"))
    params = _adapter_parameters(bundle / "adapters" / "r8.onnx_adapter")
    module = "model.layers.1.mlp.down_proj"
    a = params[f"{module}.lora_A"]
    b = params[f"{module}.lora_B"]
    assert a.dtype == np.float32 and a.shape == (96, 8)
    np.testing.assert_array_equal(a, stored[f"base_model.model.{module}.lora_A.weight"].T)
    np.testing.assert_allclose(b, 2 * stored[f"base_model.model.{module}.lora_B.weight"].T)
    # the graph's LoRA inputs: empty defaults on a symbolic rank axis of the projection's own
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    inputs = {v.name: v for v in graph.graph.input}
    dims_a = inputs[f"{module}.lora_A"].type.tensor_type.shape.dim
    dims_b = inputs[f"{module}.lora_B"].type.tensor_type.shape.dim
    assert [dims_a[0].dim_value, dims_a[1].dim_param] == [96, f"{module}.lora_rank"]
    assert dims_b[0].dim_param == dims_a[1].dim_param
    defaults = {t.name: list(t.dims) for t in graph.graph.initializer}
    assert defaults[f"{module}.lora_B"] == [0, 64]


def test_int4_base_keeps_float_adapters(lora_bundles):
    """An int4 base quantizes its projections (MatMulNBits) and keeps the LoRA branch float:
    with an adapter active the logits move as transformers' PeftModel's do."""
    import torch
    from peft import PeftModel

    from tests._hf import load_reference_model

    base, bundle = lora_bundles("qwen2", "int4")
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("MatMulNBits") >= 3 * 5  # packed qkv, o, gate, up, down of each layer
    params = _adapter_parameters(bundle / "adapters" / "r4.onnx_adapter")
    assert {value.dtype for value in params.values()} == {np.dtype(np.float32)}
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([PROMPT], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for value in session.get_inputs():
        if value.name.startswith("past_key_values"):
            feed[value.name] = np.zeros((1, 2, 0, 16), np.float32)
    plain = session.run(["logits"], feed)[0]
    adapted = session.run(["logits"], {**feed, **params})[0]
    reference = load_reference_model(base.checkpoint)
    with torch.no_grad():
        hf_plain = reference(torch.tensor(ids)).logits.numpy()
        peft = PeftModel.from_pretrained(reference, base.adapters["r4"])
        hf_adapted = peft(torch.tensor(ids)).logits.numpy()

    def gap(x, y):
        return float(np.abs(x - y).mean())

    rounding = gap(plain, hf_plain)  # int4 rounding of the base (0.47 mean here)
    assert gap(hf_adapted, hf_plain) > 2 * rounding  # the adapter matters more (1.37)
    # the adapted int4 graph is PeftModel's up to the base's rounding (0.63), and far from the
    # base model's logits (1.31): an adapter ignored or mis-scaled fails one of the two
    assert gap(adapted, hf_adapted) < 1.5 * rounding
    assert gap(adapted, hf_adapted) < 0.6 * gap(adapted, hf_plain)
    # and og runs it with the adapter active
    model, adapters = _loaded(bundle)
    assert len(_greedy(model, adapters, "r4")) == NEW_TOKENS
