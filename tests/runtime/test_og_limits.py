"""onnxruntime-genai 0.18's limits that bundle/og_support.py names, shown on the bundle og's
own builder writes for the same checkpoint: what og refuses (or gets wrong) for our bundles, it
refuses for the builder's too, with the same words where the builder writes the same kind (a
pruned LM head, lfm2), with og's other words where it writes another (vision-language:
a text decoder alone; Qwen3.5: mrope's 3-D position_ids), and where it writes none (Mamba2
hybrids: the builder crashes) what og refuses the kind it resembles (gated delta nets)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
import torch

import mobius_genai
from mobius_genai.bundle.genai_config import CONFIG_FILENAME
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.og_support import (
    BEAM,
    ENGINE,
    NGRAM,
    REWIND,
    bundle_og_limits,
    og_limits,
)
from mobius_genai.bundle.recurrent import delta_layers, kv_layers
from mobius_genai.bundle.schema import read_bundle_json
from tests._hf import load_reference_model
from tests.runtime._og import PROMPTS, alone, engine_tokens, generator
from tests.runtime.conftest import run_builder

FAILED = "EngineErrorCode.ENGINE_EXECUTION_FAILURE"


def _engine_cause(model: og.Model) -> str:
    """og's cause for a failed Engine turn (the next begin_turn raises with it)."""
    tokens, failures = engine_tokens(model, PROMPTS[:1], 4)
    assert tokens == [[]] and failures == [FAILED]
    engine = og.Engine(model)
    request = engine.create_request()
    request.begin_turn(np.asarray(PROMPTS[0], np.int32), og.TurnOptions(request))
    for _ in engine.run(engine.create_event_buffer(4)):
        pass
    with pytest.raises(RuntimeError) as error:
        request.begin_turn(np.asarray(PROMPTS[0], np.int32), og.TurnOptions(request))
    return str(error.value)


def _builder_config(folder: Path) -> dict:
    """The builder's genai_config as written (our schema lists neither its qwen2_5_vl_text nor
    a qwen2_5_vl without vision and embedding sections, which og reads)."""
    return json.loads((folder / CONFIG_FILENAME).read_text())


def test_pruned_lm_head_fails_the_same_apis_on_the_builders_bundle(pruned, builder_pruned):
    ours, theirs = og.Model(str(pruned.bundle)), og.Model(str(builder_pruned))
    assert bundle_og_limits(pruned.bundle) == bundle_og_limits(builder_pruned)
    assert ENGINE in bundle_og_limits(pruned.bundle)
    for model in (ours, theirs):
        assert "Got invalid dimensions for output: logits" in _engine_cause(model)
        assert generator(model, PROMPTS[0], 2).get_output("logits").shape[1] == 1
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=20)
        params.set_speculative_options(ngram_size=2)
        with pytest.raises(RuntimeError, match="pruned last-token-only logits are not supported"):
            og.Generator(model, params).append_tokens(np.asarray([PROMPTS[0]], np.int32))
    assert alone(ours, PROMPTS[0], 8) == alone(theirs, PROMPTS[0], 8)


def test_lfm2_engine_refusal_is_the_builders_too(lfm2, builder_lfm2, dense):
    assert mobius_genai.engine_support(dense.bundle) is None
    assert mobius_genai.engine_support(lfm2.bundle).startswith(
        "og.Engine does not run this bundle: og 0.18 runs model.type lfm2"
    )
    assert bundle_og_limits(lfm2.bundle) == bundle_og_limits(builder_lfm2)
    for folder in (lfm2.bundle, builder_lfm2):
        with pytest.raises(RuntimeError, match="The model type is not supported for decoding"):
            og.Engine(og.Model(str(folder)))


def test_og_engine_runs_no_vision_language_bundle_ours_or_the_builders(
    qwen2_5_vl_bundle, builder_qwen2_5_vl, builder_qwen2_5_vl_decoder
):
    """og's builder writes no multimodal pipeline: of a Qwen2.5-VL checkpoint, the text decoder
    alone (og.Generator gives our tokens) or, with exclude_embeds, a lone decoder og.Model does
    not load. og.Engine refuses our pipeline's model.type, and fails every turn of the
    builder's decoder (its mrope 3-D position_ids), as og_limits says of each."""
    ours, theirs = og.Model(str(qwen2_5_vl_bundle)), og.Model(str(builder_qwen2_5_vl))
    assert (ours.type, theirs.type) == ("qwen2_5_vl", "qwen2_5_vl_text")
    with pytest.raises(RuntimeError, match="The model type is not supported for decoding"):
        og.Engine(ours)
    assert "vision-language" in bundle_og_limits(qwen2_5_vl_bundle)[ENGINE]
    assert "Invalid rank for input: position_ids Got: 2 Expected: 3" in _engine_cause(theirs)
    config = _builder_config(builder_qwen2_5_vl)
    limits = og_limits(config, GraphInfo.from_file(builder_qwen2_5_vl / "model.onnx"))
    assert "3-D position_ids" in limits[ENGINE] and "3-D position_ids" in limits[BEAM]
    # without bos 381, which the builder's genai_config names its pad token (og masks it)
    prompts = [prompt[1:] for prompt in PROMPTS]
    expected = [alone(ours, prompt, 4) for prompt in prompts]
    assert [alone(theirs, prompt, 4) for prompt in prompts] == expected
    assert engine_tokens(theirs, prompts, 4) == ([[], [], []], [FAILED] * 3)
    with pytest.raises(RuntimeError, match="Got invalid dimensions for input: position_ids"):
        generator(theirs, prompts[0], 6, num_beams=3)
    config = _builder_config(builder_qwen2_5_vl_decoder)["model"]
    assert config["type"] == "qwen2_5_vl" and "inputs_embeds" in config["decoder"]["inputs"]
    with pytest.raises(RuntimeError, match="Loading a model package from a directory path"):
        og.Model(str(builder_qwen2_5_vl_decoder))


def test_delta_net_engine_failure_is_the_builders_too(delta_net, builder_delta_net):
    """The builder's bundle of the same gated-delta-net decoder: og.Generator gives both the
    same tokens; og.Engine fails every turn of both (og's cause for the builder's is its 3-D
    position_ids, met before the states); rewind and n-gram decoding are refused alike."""
    ours, theirs = og.Model(str(delta_net.bundle)), og.Model(str(builder_delta_net))
    assert ours.type == theirs.type == "qwen3_5_text"
    assert [alone(ours, prompt, 4) for prompt in PROMPTS] == [
        alone(theirs, prompt, 4) for prompt in PROMPTS
    ]
    assert bundle_og_limits(delta_net.bundle) == bundle_og_limits(builder_delta_net)
    assert "Missing Input: past_key_values.0.conv_state" in _engine_cause(ours)
    assert "Invalid rank for input: position_ids Got: 2 Expected: 3" in _engine_cause(theirs)
    assert engine_tokens(theirs, PROMPTS, 4) == ([[], [], []], [FAILED] * 3)
    for model in (ours, theirs):
        made = generator(model, PROMPTS[0], 6)
        made.generate_next_token()
        with pytest.raises(RuntimeError, match="RewindTo.*not supported without a snapshot"):
            made.rewind_to(len(PROMPTS[0]))
    with pytest.raises(RuntimeError, match="Got invalid dimensions for input: position_ids"):
        generator(theirs, PROMPTS[0], 6, num_beams=3)


def _declared(folder: Path, out: Path, **sections) -> og.Model:
    """A copy of the bundle in `folder` whose genai_config's decoder section has `sections`
    merged in (the graph unchanged)."""
    shutil.copytree(folder, out)
    config = json.loads((out / CONFIG_FILENAME).read_text())
    decoder = config["model"]["decoder"]
    for key in ("inputs", "outputs"):
        decoder[key] = {**decoder[key], **sections.pop(key, {})}
    if "engine" in sections:
        config["engine"] = sections.pop("engine")
    decoder.update(sections)
    (out / CONFIG_FILENAME).write_text(json.dumps(config))
    return og.Model(str(out))


def test_delta_net_engine_fails_with_the_builders_state_declaration(delta_net, tmp_path):
    """Declaring the gated delta nets' states as og's builder does (past_conv_names /
    past_recurrent_names, or its fixed_conv / fixed_recurrent state groups) does not make og
    0.18's Engine feed them: its static batch still leaves them out, and it runs the groups
    only in its dynamic batching, which needs paged attention's packed position_ids. So the
    Engine limit stands however genai_config names the states; og.Generator reads each."""
    folder = delta_net.bundle
    names = {
        "inputs": {
            "past_conv_names": "past_key_values.%d.conv_state",
            "past_recurrent_names": "past_key_values.%d.recurrent_state",
        },
        "outputs": {
            "present_conv_names": "present.%d.conv_state",
            "present_recurrent_names": "present.%d.recurrent_state",
        },
    }
    config = read_bundle_json(folder / CONFIG_FILENAME)
    graph = GraphInfo.from_file(folder / "model.onnx")
    decoder = config["model"]["decoder"]
    layers = list(delta_layers(decoder["inputs"], graph))
    fixed = [{"kind": f"fixed_{kind}", "layer_ids": layers} for kind in ("conv", "recurrent")]
    paged = [{"kind": "paged_kv", "layer_ids": list(kv_layers(decoder, decoder["inputs"], graph))}]
    paged += fixed
    dynamic = {"dynamic_batching": {"block_size": 16, "max_batch_size": 4, "num_blocks": 8}}
    expected = [alone(og.Model(str(folder)), prompt, 4) for prompt in PROMPTS]
    declared = _declared(folder, tmp_path / "named", **names)
    assert [alone(declared, prompt, 4) for prompt in PROMPTS] == expected
    assert "Missing Input: past_key_values.0.conv_state" in _engine_cause(declared)
    written = _builder_config(tmp_path / "named")
    assert "Missing Input" in og_limits(written, graph)[ENGINE]
    grouped = _declared(folder, tmp_path / "grouped", state_groups=fixed, **names)
    assert alone(grouped, PROMPTS[0], 4) == expected[0]
    with pytest.raises(RuntimeError, match="Fixed decoder state groups require engine.dynamic_"):
        engine_tokens(grouped, PROMPTS, 4)
    packed = r"Packed hybrid execution requires position_ids .* \[num_tokens\]"
    batched = _declared(folder, tmp_path / "batched", state_groups=paged, engine=dynamic, **names)
    with pytest.raises(RuntimeError, match=packed):
        engine_tokens(batched, PROMPTS, 4)


def test_left_padding_gives_the_builders_tokens_not_transformers(dense, builder_pruned):
    """og gives left-padded rows absolute positions (it expects right padding): the row's
    tokens differ from transformers', identically for the builder's bundle."""
    pad = 381
    short = [17, 92, 250, 33, 7]
    batch = [[17, 92, 250, 33, 301, 8, 140, 5], [pad] * 3 + short]
    results = []
    for folder in (dense.bundle, builder_pruned):
        model = og.Model(str(folder))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=14, batch_size=2)
        made = og.Generator(model, params)
        made.append_tokens(np.asarray(batch, np.int32))
        while not made.is_done():
            made.generate_next_token()
        results.append([[int(t) for t in made.get_sequence(i)][8:] for i in range(2)])
    assert results[0] == results[1]
    ids = torch.tensor(batch)
    reference = load_reference_model(dense.checkpoint).generate(
        ids, attention_mask=(ids != pad).long(), max_new_tokens=6, do_sample=False
    )
    assert results[0][0] == reference[0, 8:].tolist()
    assert results[0][1] != reference[1, 8:].tolist()


def test_append_after_generating_differs_alike_on_the_builders_bundle(dense, builder_pruned):
    """og 0.18 continues an append made after generate_next_token differently from the same
    sequence prefilled at once, on both bundles (appends before generating agree:
    test_og_contract.py)."""
    continued = []
    for folder in (dense.bundle, builder_pruned):
        model = og.Model(str(folder))
        made = generator(model, PROMPTS[0], 20)
        for _ in range(4):
            made.generate_next_token()
        so_far = [int(t) for t in made.get_sequence(0)]
        made.append_tokens(np.asarray([[17, 92, 250]], np.int32))
        for _ in range(5):
            made.generate_next_token()
        continued.append([int(t) for t in made.get_sequence(0)][len(so_far) + 3 :])
        fresh = alone(model, [*so_far, 17, 92, 250], 5)
        assert continued[-1] != fresh
    assert continued[0] == continued[1]


def test_engine_limit_names_only_concatenated_caches_without_placement(default_ep):
    """A `default` bundle places each row's keys (components/kv_slots.py): og.Engine runs it
    (test_og_kinds.py). A concatenated cache whose graph appends them after the longest past
    (the graph before kv_slots.py) keeps the limit."""
    assert ENGINE not in bundle_og_limits(default_ep.bundle)
    config = read_bundle_json(default_ep.bundle / CONFIG_FILENAME)
    graph = GraphInfo.from_file(default_ep.bundle / "model.onnx")
    appended = dataclasses.replace(graph, ops=graph.ops - {"ai.onnx::ScatterElements"})
    assert "package the bundle again" in og_limits(config, appended)[ENGINE]
    shared = {**config, "search": {**config["search"], "past_present_share_buffer": True}}
    assert ENGINE not in og_limits(shared, appended)


def test_mamba2_hybrid_the_builder_cannot_build_runs_as_delta_nets_run(mamba2, tmp_path_factory):
    """og's builder crashes on Granite-4.0-H's Mamba2 layers (it reads every layer as attention);
    our bundle (model.type decoder: og finds the conv and scan states by their names) runs
    og.Generator with transformers' tokens (tests/models/families/test_bundles.py), and og refuses it
    what it refuses gated delta nets, for the same cause."""
    _, done = run_builder(tmp_path_factory, mamba2.checkpoint, "granitemoehybrid")
    assert done.returncode != 0
    assert "'NoneType' object has no attribute 'q_proj'" in done.stderr
    model = og.Model(str(mamba2.bundle))
    assert model.type == "decoder"
    assert set(bundle_og_limits(mamba2.bundle)) == {ENGINE, BEAM, NGRAM, REWIND}
    assert "Missing Input: past_key_values.0.conv_state" in _engine_cause(model)
    made = generator(model, PROMPTS[0], 6)
    made.generate_next_token()
    with pytest.raises(RuntimeError, match="RewindTo.*not supported without a snapshot"):
        made.rewind_to(len(PROMPTS[0]))


def test_granite_micro_layout_gives_the_builders_tokens(granite_micro, builder_granite_micro):
    """Granite-4.0-Micro's layout (attention only) is the one granitemoehybrid og's builder
    builds: both bundles give og.Generator the same greedy tokens, and og runs ours on every
    API."""
    theirs = og.Model(str(builder_granite_micro))
    ours = og.Model(str(granite_micro.bundle))
    assert [alone(ours, prompt, 6) for prompt in PROMPTS] == [
        alone(theirs, prompt, 6) for prompt in PROMPTS
    ]
    assert bundle_og_limits(granite_micro.bundle) == {}
