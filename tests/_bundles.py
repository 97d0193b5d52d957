"""Bundle test scaffolding shared by the family tests: tiny checkpoints with the committed
tiny-qwen2 tokenizer (vocab 384, prompts fed as token ids), onnxruntime-genai's greedy tokens
for a batch, the op counts of an int4 bundle that generates, and the checks that og's tokens
(og.Generator alone and in batches, og.Engine) equal transformers'."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_genai as og

from mobius_genai import packager
from mobius_genai.cli import main as cli_main
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._hf import hf_greedy_tokens, write_tiny_checkpoint
from tests.conftest import TINY_QWEN2
from tests.runtime._og import PROMPTS, engine_tokens

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)
PROMPT = [381, 17, 92, 250, 33, 301, 8, 140]  # bos + seven tokens
NEW_TOKENS = 24
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.2, 1.5, 1.9, 2.4, 3.0, 3.7, 4.5],
    "long_factor": [1.0, 1.7, 2.6, 3.8, 5.3, 7.1, 9.2, 11.6],
}
# family → extra config: phi3 crosses its original length (16) while generating.
# gemma4_text: transformers reads its per-layer table by any token id.
EXTRA = {
    "phi3": {"rope_scaling": LONGROPE, "original_max_position_embeddings": 16},
    "gemma4_text": {"vocab_size_per_layer_input": 384},
    # six heads (ALiBi's interleaved slopes), whose greedy tokens do not repeat one token
    "bloom": {"num_attention_heads": 6, "hidden_size": 96},
}
# family → seed of its weights where seed 3's greedy continuation of PROMPT stops at eos early
# (glm4_moe_lite: its int4 bundle's, test_deepseek.py)
SEEDS = {
    "qwen3_5_text": 1,
    "ministral": 1,
    "glm4_moe_lite": 1,
    "minicpm3": 1,
    "zamba2": 1,
    "mimo_v2_flash": 4,
    "kimi_linear": 1,
}


def bundle_checkpoint(folder: Path, family: str, **overrides) -> Path:
    """A tiny `family` checkpoint for bundle tests: the vocabulary of the tiny-qwen2 tokenizer
    (whose files it copies), bos 381, eos 383, pad 0, the family's seed and extra keys."""
    ckpt = write_tiny_checkpoint(
        folder,
        family,
        seed=SEEDS.get(family, 3),
        vocab_size=384,
        bos_token_id=381,
        eos_token_id=383,
        pad_token_id=0,
        **{**EXTRA.get(family, {}), **overrides},
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, ckpt / name)
    return ckpt


def int4_bundle_ops(family: str, folder: Path) -> Counter:
    """The op counts of `family`'s cpu int4 bundle, packaged under `folder`, once
    onnxruntime-genai has generated every token asked for with it."""
    ckpt = bundle_checkpoint(folder / "ckpt", family)
    bundle = packager.package(ckpt, "cpu", folder / "bundle", precision="int4", quiet=True)
    tokens = greedy_tokens(load_model(bundle), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    return Counter(node.op_type for node in graph.node)


def batch_greedy_tokens(folder: Path, prompts: list[list[int]], new_tokens: int) -> list[list]:
    """onnxruntime-genai's greedy tokens for a batch of prompts; it takes them padded on the
    right with genai_config's pad_token_id and masks those positions."""
    model = load_model(folder)
    longest = max(len(prompt) for prompt in prompts)
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False,
        max_length=longest + new_tokens,
        repetition_penalty=1.0,
        batch_size=len(prompts),
    )
    generator = og.Generator(model, params)
    pad = json.loads((folder / "genai_config.json").read_text())["model"]["pad_token_id"]
    generator.append_tokens(
        np.array([prompt + [pad] * (longest - len(prompt)) for prompt in prompts], np.int32)
    )
    tokens: list[list[int]] = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in zip(tokens, generator.get_next_tokens(), strict=True):
            row.append(int(token))
    return tokens


def assert_og_batches_continue_each_prompt(ckpt: Path, folder: Path) -> None:
    """og.Generator's batch of two prompts of different lengths (the shorter padded on the
    right) and og.Engine's requests of different lengths each continue as transformers
    continues that prompt alone."""
    prompts = [PROMPT, PROMPT[:5]]
    ours = batch_greedy_tokens(folder, prompts, 12)
    theirs = [hf_greedy_tokens(ckpt, prompt, 12, stop_at_eos=False) for prompt in prompts]
    assert ours == theirs
    assert len({tuple(row) for row in theirs}) == 2
    assert_engine_continues_each_prompt(ckpt, folder)


def assert_engine_continues_each_prompt(ckpt: Path, folder: Path) -> None:
    """og.Engine's requests of different lengths (tests/runtime/_og.py's PROMPTS), begun
    together, each continue as transformers continues that prompt alone."""
    tokens, failures = engine_tokens(og.Model(str(folder)), PROMPTS, 8)
    assert failures == []
    assert tokens == [hf_greedy_tokens(ckpt, list(prompt), 8) for prompt in PROMPTS]


def check_bundle_generates_like_transformers(ckpt: Path, tmp_path: Path, capsys) -> None:
    """`ckpt`'s cpu bundle validates, and og's greedy tokens equal transformers', alone and in
    a batch of prompts of different lengths."""
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    assert cli_main(["validate", str(folder)]) == 0
    assert "valid (decoder," in capsys.readouterr().out
    ours = greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + NEW_TOKENS)
    assert ours == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(ours) == NEW_TOKENS
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in prompts]
