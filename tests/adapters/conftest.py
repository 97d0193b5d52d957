"""Fixtures for LoRA adapter tests: tiny Qwen2 and Llama bases, two PEFT adapters each (every
projection, ranks 4 and 8, non-zero B) made locally with peft, and bundles packaged with them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from mobius_genai import packager
from tests._bundles import bundle_checkpoint
from tests._hf import hf_forward, load_reference_model

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [381, 17, 92, 250, 33, 301, 8, 140]
NEW_TOKENS = 12
RANKS = {"r4": 4, "r8": 8}


@dataclasses.dataclass(frozen=True)
class LoraBase:
    """A tiny checkpoint and its PEFT adapters by name."""

    checkpoint: Path
    adapters: dict[str, Path]


def make_adapter(checkpoint: Path, out: Path, rank: int, seed: int, **config) -> Path:
    """A PEFT LoRA adapter of `checkpoint` in `out` with random A and B (init_lora_weights=False
    gives B non-zero values, unlike a freshly initialized adapter)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    settings = {"target_modules": PROJECTIONS, "lora_alpha": 2 * rank, **config}
    lora = LoraConfig(r=rank, init_lora_weights=False, **settings)
    get_peft_model(load_reference_model(checkpoint), lora).save_pretrained(out)
    return out


def peft_greedy(
    checkpoint: Path, adapter: Path | None, prompt: Sequence[int], new: int
) -> list[int]:
    """Greedy tokens of transformers' model with the PEFT adapter applied (PeftModel), cached,
    stopping after eos like onnxruntime-genai."""
    from peft import PeftModel

    model = load_reference_model(checkpoint)
    eos = model.config.eos_token_id
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).base_model.model  # LoRA layers in place
    ids, cache, tokens = torch.tensor([list(prompt)]), None, []
    with torch.no_grad():
        while len(tokens) < new:
            logits, cache = hf_forward(model, cache, input_ids=ids)
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == eos:
                break
            ids = torch.tensor([[tokens[-1]]])
    return tokens


def _base(factory: pytest.TempPathFactory, family: str) -> LoraBase:
    root = factory.mktemp(f"lora-{family}")
    checkpoint = bundle_checkpoint(root / "base", family)
    adapters = {
        name: make_adapter(checkpoint, root / name, rank, seed)
        for seed, (name, rank) in enumerate(RANKS.items(), 1)
    }
    return LoraBase(checkpoint, adapters)


@pytest.fixture(scope="session")
def qwen2_lora(tmp_path_factory) -> LoraBase:
    return _base(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def llama_lora(tmp_path_factory) -> LoraBase:
    return _base(tmp_path_factory, "llama")


def package_with(base: LoraBase, out: Path, names: Sequence[str], **options) -> Path:
    adapters = {name: base.adapters[name] for name in names}
    return packager.package(
        base.checkpoint, "cpu", out, adapters=adapters, quiet=True, smoke_test=False, **options
    )


@pytest.fixture(scope="session")
def lora_bundles(tmp_path_factory, qwen2_lora, llama_lora):
    """(family, precision) → (LoraBase, bundle with both adapters), packaged once."""
    bases = {"qwen2": qwen2_lora, "llama": llama_lora}
    made: dict[tuple[str, str], tuple[LoraBase, Path]] = {}

    def get(family: str, precision: str = "fp32") -> tuple[LoraBase, Path]:
        if (family, precision) not in made:
            out = tmp_path_factory.mktemp("lora-bundles") / f"{family}-{precision}"
            base = bases[family]
            made[family, precision] = (
                base,
                package_with(base, out, list(RANKS), precision=precision),
            )
        return made[family, precision]

    return get
