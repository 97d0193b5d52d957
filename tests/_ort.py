"""Test-only helpers: run a decoder graph in onnxruntime over the calls of a ReferenceRun, open
a package's graphs, generate greedily with onnxruntime-genai."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch

import mobius_genai
from mobius_genai import ModelPackage
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError, WeightsError
from mobius_genai.runtime.smoke_image import SMOKE_IMAGE_TEXT, png_bytes, smoke_pixels
from tests._hf import (
    ReferenceRun,
    gemma_multimodal_layout,
    hf_reference_logits,
    write_tiny_checkpoint,
)


def ort_session(package: ModelPackage, directory: Path) -> ort.InferenceSession:
    """Save the package's decoder to `directory` and open it on the CPU EP."""
    package.save(directory, progress=False)
    return ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])


def run_like_reference(session: ort.InferenceSession, run: ReferenceRun) -> list[np.ndarray]:
    """Feed the graph exactly what transformers was fed, threading the KV cache through.

    Inputs the graph does not have (position_ids once GQA derives positions) are left out.
    Returns the logits of every call.
    """
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    batch = run.prefill.input_ids.shape[0]
    cache = {}
    for name, info in inputs.items():
        dtype = np.float16 if info.type == "tensor(float16)" else np.float32
        if name.endswith((".key", ".value")):
            _, heads, _, head_dim = info.shape
            cache[name] = np.zeros((batch, heads, 0, head_dim), dtype)
        elif name.startswith("past"):  # a recurrent layer's state: zeros of its fixed size
            cache[name] = np.zeros((batch, *info.shape[1:]), dtype)
    renames = {o for o in outputs if o.startswith("present.")}
    all_logits = []
    for step in run.steps:
        feeds = {
            "input_ids": step.input_ids,
            "attention_mask": step.attention_mask,
            "position_ids": step.position_ids,
            **cache,
        }
        results = dict(
            zip(
                outputs,
                session.run(outputs, {k: v for k, v in feeds.items() if k in inputs}),
                strict=True,
            )
        )
        all_logits.append(results["logits"])
        cache = {past_name(name): value for name, value in results.items() if name in renames}
    return all_logits


def past_name(present: str) -> str:
    """The graph input a present output feeds next step: present.i.key → past_key_values.i.key,
    present.i.conv_state → past_key_values.i.conv_state, present.i.conv → past.i.conv
    (onnxruntime-genai's names)."""
    if present.endswith((".key", ".value", "_state")):
        return present.replace("present.", "past_key_values.", 1)
    return present.replace("present.", "past.", 1)


def graph_diffs(
    ckpt: Path, reference: ReferenceRun, eps: tuple[str, ...], directory: Path, **build_args
) -> dict[str, float]:
    """Per EP in `eps`: the largest logits difference of ckpt's f32 graph for that EP from
    `reference` (transformers' run), over all its calls."""
    diffs = {}
    for ep in eps:
        package = mobius_genai.build(ckpt, ep, "f32", **build_args)
        ours = run_like_reference(ort_session(package, directory / ep), reference)
        diffs[ep] = max_abs_diff(ours, reference.logits)
    return diffs


def parity_diffs(
    directory: Path,
    ckpt: Path,
    ids: np.ndarray,
    decode_steps: int = 4,
    eps: tuple[str, ...] = ("default", "cpu"),
    **build_args,
) -> dict[str, float]:
    """`graph_diffs` of `ckpt`'s graphs for `eps` (the portable and cpu ones by default) from
    transformers' prefill of `ids` and `decode_steps` cached decode steps."""
    reference = hf_reference_logits(ckpt, ids, decode_steps=decode_steps)
    return graph_diffs(ckpt, reference, eps, directory, **build_args)


def case_diffs(
    directory: Path, family: str, ids: np.ndarray, eps: tuple[str, ...], *, seed: int, **overrides
) -> dict[str, float]:
    """`graph_diffs` of a tiny `family` checkpoint (tests/_hf.py's row with `overrides`) from
    transformers' prefill of `ids` and 4 cached decode steps."""
    ckpt = write_tiny_checkpoint(directory / "ckpt", family, seed=seed, **overrides)
    reference = hf_reference_logits(ckpt, ids, decode_steps=4)
    return graph_diffs(ckpt, reference, eps, directory, progress=False)


def left_padded_diffs(ckpt: Path, directory: Path) -> tuple[float, float]:
    """The portable graph against transformers on a batch of two where the first row is
    left-padded by 4: (largest logits difference at the first row's real positions, largest
    over the rest: the second row and the decode steps). Padding positions' logits mean
    nothing."""
    ids = np.random.default_rng(1).integers(3, 128, size=(2, 10))
    mask = np.ones_like(ids)
    mask[0, :4] = 0
    reference = hf_reference_logits(ckpt, ids, decode_steps=3, attention_mask=mask)
    package = mobius_genai.build(ckpt, "default", "f32")
    ours = run_like_reference(ort_session(package, directory), reference)
    real = mask.astype(bool)
    first = float(np.abs(ours[0][real] - reference.logits[0][real]).max())
    return first, max_abs_diff(ours[1:], reference.logits[1:])


#: A prompt long enough that a recurrent layer's chunked scan matters (transformers scans in 16-
#: or 64-token chunks, then token by token).
LONG_PREFILL = 70


def long_prefill_reference(checkpoint: Path, decode_steps: int = 4) -> ReferenceRun:
    """transformers' logits over a LONG_PREFILL-token prompt, then `decode_steps` cached steps."""
    ids = np.random.default_rng(0).integers(3, 128, size=(1, LONG_PREFILL))
    return hf_reference_logits(checkpoint, ids, decode_steps=decode_steps)


def built_graph_diff(
    checkpoint: Path, reference: ReferenceRun, ep: str, directory: Path
) -> tuple[set[str], float]:
    """(the op domains of `ep`'s float32 graph of `checkpoint`, its largest logit difference
    from `reference` over the same prefill and decode steps)."""
    package = mobius_genai.build(checkpoint, ep, "f32")
    domains = {node.domain for node in package["model"].graph.all_nodes()}
    ours = run_like_reference(ort_session(package, directory), reference)
    return domains, max_abs_diff(ours, reference.logits)


def max_abs_diff(ours: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest absolute difference over all calls' logits."""
    return max(
        float(np.abs(a.astype(np.float32) - b).max()) for a, b in zip(ours, reference, strict=True)
    )


def model_ops(model: ir.Model) -> set[tuple[str, str]]:
    """The (domain, op type) pairs of every node in `model`, subgraphs included."""
    return {(node.domain or "", node.op_type) for node in model.graph.all_nodes()}


def assert_only_the_decoder_fuses_gqa(package: ModelPackage, ep: str) -> None:
    """A vision-language package's graphs: GroupQueryAttention in none but the decoder (the
    towers attend both ways), and on onnx-standard every graph in the standard domain."""
    for key, model in package.items():
        ops = model_ops(model)
        if key != "decoder":
            assert ("com.microsoft", "GroupQueryAttention") not in ops, key
        if ep == "onnx-standard":
            assert {domain for domain, _ in ops} <= {"", "ai.onnx"}, key


def saved_ops(path: Path) -> set[tuple[str, str]]:
    """The (domain, op type) pairs of a saved graph's nodes, its weights left unread."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {(node.domain, node.op_type) for node in graph.node}


def package_sessions(package: ModelPackage) -> dict[str, ort.InferenceSession]:
    """A CPU session of each graph of the package, by package key (serialized in memory)."""
    return {
        key: ort.InferenceSession(
            ir.serde.serialize_model(model).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
        for key, model in package.items()
    }


def run_declared(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Outputs by name, fed only the inputs the graph declares (an input nothing reads, such as
    the position_ids GroupQueryAttention computes itself, is removed from the graph)."""
    names = [value.name for value in session.get_outputs()]
    declared = {value.name for value in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feeds.items() if k in declared})
    return dict(zip(names, outputs, strict=True))


def decode_like_transformers(
    model, sessions: dict[str, ort.InferenceSession], outputs: dict[str, np.ndarray], reference,
    steps: int = 3, tolerance: float = 1e-4, mrope_delta: int | None = None,
) -> list[int]:  # fmt: skip
    """After a vision-language prefill (the decoder's `outputs`, transformers' `reference`),
    `steps` greedy decode steps through the embedding graph (no image features) and the
    decoder at 1-D positions (3-D mrope ones moved by `mrope_delta`, transformers'
    rope_deltas), then a step that feeds the image token (a placeholder generated, with no
    features behind it), each step's logits against transformers' within `tolerance`.
    Returns the greedy tokens fed."""
    import torch

    cache, token = reference.past_key_values, reference.logits[:, -1:].argmax(-1)
    total = reference.logits.shape[1]
    hidden = sessions["embedding"].get_inputs()[1].shape[1]
    no_features = np.zeros((0, hidden), np.float32)
    greedy = []
    for index in range(steps + 1):
        if index == steps:
            token = torch.tensor([[model.config.image_token_id]])
        else:
            greedy.append(int(token))
        with torch.no_grad():
            step = model(input_ids=token, cache=cache, use_cache=True)
        embeds = run_declared(
            sessions["embedding"], {"input_ids": token.numpy(), "image_features": no_features}
        )["inputs_embeds"]
        total += 1
        feeds = {
            "inputs_embeds": embeds,
            "input_ids": token.numpy(),
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": np.array([[total - 1]])
            if mrope_delta is None
            else np.full((3, 1, 1), total - 1 + mrope_delta, np.int64),
            **{past_name(name): value for name, value in outputs.items() if "present" in name},
        }
        outputs = run_declared(sessions["decoder"], feeds)
        np.testing.assert_allclose(outputs["logits"], step.logits.numpy(), atol=tolerance, rtol=0)
        cache, token = step.past_key_values, step.logits[:, -1:].argmax(-1)
    return greedy


def assert_og_takes_tokens_as_transformers(
    model, bundle: Path, prompt: list[int], steps: list[int], tolerance: float = 1e-4
) -> None:
    """og.Generator over a vision-language bundle's `prompt` with no media, then each of
    `steps` appended as a decode step: og runs on, each step's logits those of transformers'
    forward without pixel values within `tolerance`, and og's next greedy token transformers'."""
    import onnxruntime_genai as og

    og_model = og.Model(str(bundle))
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + len(steps) + 1)
    generator = og.Generator(og_model, params)
    fed: list[int] = []
    for tokens in (prompt, *([token] for token in steps)):
        generator.append_tokens(np.asarray([tokens], np.int32))
        fed += tokens
        with torch.no_grad():
            expected = model(input_ids=torch.tensor([fed])).logits[:, -1:].numpy()
        np.testing.assert_allclose(generator.get_logits(), expected, atol=tolerance, rtol=0)
    generator.generate_next_token()
    assert int(generator.get_next_tokens()[0]) == int(expected.argmax())


def og_greedy(og_model, inputs, new_tokens: int) -> list[int]:
    """onnxruntime-genai's greedy tokens after a multimodal processor's `inputs`."""
    import onnxruntime_genai as og

    length = inputs["input_ids"].as_numpy().shape[1]
    params = og.GeneratorParams(og_model)
    params.set_search_options(do_sample=False, max_length=length + new_tokens)
    generator = og.Generator(og_model, params)
    generator.set_inputs(inputs)
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def assert_validate_names(
    bundle: Path, tmp_path: Path, change: Callable[[dict], object], named: str
) -> None:
    """validate_bundle passes `bundle`, then names `named` once `change` has edited the
    "model" section of a copy's genai_config.json."""
    validate_bundle(bundle)
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy)
    path = copy / "genai_config.json"
    config = json.loads(path.read_text())
    change(config["model"])
    path.write_text(json.dumps(config))
    (copy / "mobius_manifest.json").unlink()  # its sizes and hashes are of the original
    with pytest.raises(BundleError, match=re.escape(named)):
        validate_bundle(copy)


def smoke_image_prompt(
    bundle: Path, placeholder: str, side: int
) -> tuple[np.ndarray, torch.Tensor]:
    """The smoke test's `side` x `side` image and the ids og's processor makes of its prompt
    (`placeholder` before the smoke text): what transformers continues to check the smoke test."""
    import onnxruntime_genai as og

    pixels = smoke_pixels(side, side)
    processor = og.Model(str(bundle)).create_multimodal_processor()
    inputs = processor(
        f"{placeholder} {SMOKE_IMAGE_TEXT}", images=og.Images.open_bytes(png_bytes(pixels))
    )
    return pixels, torch.from_numpy(inputs["input_ids"].as_numpy().astype(np.int64))


def og_sequence(bundle, prompt: list[int], max_length: int) -> list[int]:
    """onnxruntime-genai's whole sequence (prompt and generated tokens) for a bundle folder,
    with its default search options up to `max_length`."""
    import onnxruntime_genai as og

    model = og.Model(str(bundle))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    while not generator.is_done():
        generator.generate_next_token()
    return list(generator.get_sequence(0))


def reference_evaluator_logits(model: ir.Model, ids: np.ndarray) -> np.ndarray:
    """The prefill logits of `model` for `ids` [1, seq] on onnx's reference evaluator (a runtime
    without onnxruntime's kernels, so Tier-1 bodies run): empty KV caches, zero states."""
    from onnx.reference import ReferenceEvaluator

    (logits,) = ReferenceEvaluator(ir.to_proto(model)).run(["logits"], prefill_feeds(model, ids))
    return logits


def prefill_feeds(model: ir.Model, ids: np.ndarray, **given: np.ndarray) -> dict[str, np.ndarray]:
    """Every input of `model` for a prefill of `ids` [1, seq]: empty KV caches, zero states;
    `given` feeds the other inputs (a vision-language decoder's inputs_embeds)."""
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(ids.shape[1])[None],
        **given,
    }
    for value in model.graph.inputs:
        if value.name not in feeds:  # empty KV caches [1, heads, 0, dim], zero states
            sizes = [1, *value.shape[1:]]
            if value.name.endswith((".key", ".value")):
                sizes[2] = 0
            feeds[value.name] = np.zeros(sizes, np.float32)
    return feeds


def mutant_diffs(
    ckpt: Path, ids: np.ndarray, directory: Path, family: str, mutant, monkeypatch
) -> tuple[float, float]:
    """The portable graph's largest logits difference from transformers (a prefill and one
    decode step) as built, then as built with `mutant`: a (module, name, replacement) to patch,
    or a row that replaces `family`'s in the family table."""
    from mobius_genai.models import FAMILIES

    reference = hf_reference_logits(ckpt, ids, decode_steps=1)
    diffs = []
    for name in ("ours", "mutant"):
        if name == "mutant" and isinstance(mutant, tuple):
            monkeypatch.setattr(*mutant)
        elif name == "mutant":
            monkeypatch.setitem(FAMILIES, family, mutant)
        package = mobius_genai.build(ckpt, "default", "f32", progress=False)
        ours = run_like_reference(ort_session(package, directory / name), reference)
        diffs.append(max_abs_diff(ours, reference.logits))
    return diffs[0], diffs[1]


def multimodal_text_decoder_diff(
    text: Path, directory: Path, model_type: str, towers: tuple[str, ...]
) -> float:
    """`text`'s checkpoint as the hub stores a multimodal Gemma (tests/_hf.py's
    `gemma_multimodal_layout`, `towers` beside it) built text-only: its largest logits
    difference from transformers' run of `text` itself; the same with one more unread tensor
    must be refused, naming it."""
    hub = gemma_multimodal_layout(text, directory / "hub", model_type, towers)
    ids = np.random.default_rng(2).integers(3, 128, size=(1, 12))
    reference = hf_reference_logits(text, ids, decode_steps=3)
    package = mobius_genai.build(hub, "default", "f32")
    ours = run_like_reference(ort_session(package, directory / "graph"), reference)
    stray = gemma_multimodal_layout(
        text, directory / "stray", model_type, towers, "model.stray.weight"
    )
    with pytest.raises(WeightsError, match="model.stray.weight"):
        mobius_genai.build(stray, "default", "f32")
    return max_abs_diff(ours, reference.logits)
