"""Self-tests of the transformers test helpers (tests/_hf.py) and the tiny-qwen2 fixture."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests._hf import (
    FAMILIES,
    hf_greedy_tokens,
    hf_reference_logits,
    load_reference_model,
    positions_from_mask,
    write_tiny_checkpoint,
)
from tests.conftest import TINY_QWEN2

ATOL = 1e-5  # float32 eager, cached vs uncached

# attention_bias exercises the bias paths where the family has the switch.
_BIAS = {
    family: {"attention_bias": True}
    for family in (
        "llama",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "olmo",
        "olmo2",
        "smollm3",
        "exaone",
        "cohere",
        "cohere2",
        "cohere2_moe",
        "arcee",
        "helium",
        "olmo3",
        "hunyuan_v1_dense",
        "vaultgemma",
        "qwen3_moe",
        "olmoe",
        "granitemoe",
        "deepseek_v3",
        "deepseek_v2",
        "llama4_text",
        "apertus",
        "nanochat",
        "bitnet",
    )
}
_BIAS["nemotron"] = {"attention_bias": True, "mlp_bias": True}
_BIAS["internlm3"] = {"attention_bias": True, "mlp_bias": True}  # equal, as its config requires
_BIAS["nemotron_h"] = {"use_bias": True, "mlp_bias": True}  # Mamba2 projections, MLPs
_BIAS["granitemoeshared"] = _BIAS["glm4_moe_lite"] = _BIAS["solar_open"] = {"attention_bias": True}
_BIAS["cwm"] = {"mlp_bias": True}  # CwmAttention has none; its MLP reads mlp_bias
_BIAS["granite_swa"] = {"attention_bias": True, "mlp_bias": True}
_BIAS["granitemoe_swa"] = {"attention_bias": True}
_BIAS["diffllama"] = _BIAS["laguna"] = _BIAS["mellum"] = {"attention_bias": True}
_BIAS["mimo_v2_flash"] = {"attention_bias": True}
_BIAS["kimi_linear"] = {"attention_bias": True}  # the latent attention's kv_a and o projections
_BIAS["iquestcoder"] = {"attention_bias": True, "mlp_bias": True}
_BIAS["sarvam_mla"] = _BIAS["aria_text"] = _BIAS["youtu"] = {"attention_bias": True}
_BIAS["apertus1p5_text"] = _BIAS["cohere_compass_text"] = {"attention_bias": True}
_BIAS["hyperclovax"] = {"attention_bias": True, "mlp_bias": True}
# families without a bias switch (ernie4_5_moe's use_bias is refused)
_NO_BIAS = {
    *("mistral", "ministral", "ministral3", "phi3", "exaone4", "mixtral", "minimax_m2"),
    *("ernie4_5_moe", "minimax", "exaone_moe", "dbrx"),
    "mpt",  # MptModel builds no bias whatever no_bias says (false is refused)
    "kolibri1",  # EXAONE 4's attention, unbiased
}
_NO_NORM_WEIGHTS = {"olmo", "nanochat"}  # norms without learnable parameters
# (pattern, replacement) from checkpoint names to state_dict names, where transformers renames
# tensors on load (transformers/conversion_mapping.py)
_LOADED_AS = {
    "gpt_neox": [(r"^embed_out\.", "lm_head.")],
    "exaone": [
        (r"^transformer\.wte\.", "model.embed_tokens."),
        (r"^transformer\.h\.", "model.layers."),
        (r"^transformer\.ln_f\.", "model.norm."),
        (r"\.attn\.attention\.out_proj\.", ".self_attn.o_proj."),
        (r"\.attn\.attention\.", ".self_attn."),
        (r"\.ln_1\.", ".input_layernorm."),
        (r"\.ln_2\.", ".post_attention_layernorm."),
        (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
        (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."),
        (r"\.mlp\.c_proj\.", ".mlp.down_proj."),
    ],
    "mixtral": [(r"\.block_sparse_moe\.", ".mlp.")],
    "minimax_m2": [(r"\.block_sparse_moe\.", ".mlp.")],
    "minimax": [(r"\.block_sparse_moe\.", ".mlp.")],
    "ernie4_5_moe": [(r"\.mlp\.moe_statics\.", ".mlp.gate.moe_statics.")],
    "phimoe": [(r"\.block_sparse_moe\.gate\.", ".mlp.router."), (r"\.block_sparse_moe\.", ".mlp.")],
    "granitemoe": [
        (r"\.input_linear\.weight$", ".experts.gate_up_proj"),
        (r"\.output_linear\.weight$", ".experts.down_proj"),
        (r"\.router\.layer\.", ".router."),
    ],
    "granitemoehybrid": [  # the experts as granitemoe's; the shared MLP keeps its names
        (r"\.block_sparse_moe\.input_linear\.weight$", ".block_sparse_moe.experts.gate_up_proj"),
        (r"\.block_sparse_moe\.output_linear\.weight$", ".block_sparse_moe.experts.down_proj"),
        (r"\.router\.layer\.", ".router."),
    ],
    "nemotron_h": [(r"^backbone\.", "model.")],  # the hub's prefix, kept on save
}
_LOADED_AS["axk1"] = [(r"\.post_mlp_layernorm\.", ".mlp.post_mlp_layernorm.")]
_LOADED_AS["minicpm5_moe"] = [(r"\.self_attn\.q_proj\.", ".self_attn.q_gate_proj.")]
_LOADED_AS["kolibri1"] = [
    (r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.post_attn_norm\.", ".post_self_attn_layernorm."),
    (r"\.post_ffn_norm\.", ".post_mlp_layernorm."),
]
_LOADED_AS["flint"] = [(r"\.self_attn\.softmax_offset$", ".self_attn.sinks")]
_LOADED_AS["hy_v3"] = [
    (r"\.mlp\.router\.gate\.", ".mlp.gate."),
    (r"\.mlp\.expert_bias$", ".mlp.e_score_correction_bias"),
    (r"\.mlp\.shared_mlp\.", ".mlp.shared_experts."),
]
_LOADED_AS["olmo_hybrid"] = [
    (r"\.attention_layer_norm\.", ".input_layernorm."),
    (r"\.feedforward_layer_norm\.", ".post_attention_layernorm."),
]
#: Checkpoint tensors transformers concatenates on load (OLMo hybrid's q, k, v convs into one
#: conv1d) as (pattern with group `part`, the parts in order, the loaded tensor's name), and
#: tensors it splits (Lara-Mini's in_proj) as (pattern, the loaded tensors it concatenates).
_JOINED_ON_LOAD = {
    "olmo_hybrid": (r"\.(?P<part>q|k|v)_conv1d\.weight$", ("q", "k", "v"), ".conv1d.weight"),
}
_JOINED_ON_LOAD["kimi_linear"] = _JOINED_ON_LOAD["olmo_hybrid"]
_SPLIT_ON_LOAD = {
    "lara_mini": (
        r"\.in_proj\.weight$",
        tuple(f".in_proj_{part}.weight" for part in ("qkv", "z", "b", "a")),
    ),
}
_LOADED_AS["kimi_linear"] = [
    (r"\.block_sparse_moe\.", ".mlp."),
    (r"\.self_attn\.(f_a_proj|f_b_proj|dt_bias|A_log)", r".self_attn.forget_gate.\1"),
]
_LOADED_AS["lara_mini"] = [(r"\.linear_attn\.out_norm\.", ".linear_attn.norm.")]
# Param2's and Sarvam-30B's original names (q, k and v rows fused in query_key_value: below)
_LOADED_AS["sarvam_moe"] = _LOADED_AS["param2moe"] = [
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.dense\.", ".self_attn.o_proj."),
    (r"\.attention\.query_layernorm\.", ".self_attn.q_norm."),
    (r"\.attention\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.attention\.", ".self_attn."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
]
_LOADED_AS["aria_text"] = [
    (r"\.experts\.fc1\.weight$", ".experts.gate_up_proj"),
    (r"\.experts\.fc2\.weight$", ".experts.down_proj"),
]
_SPLIT_QKV = {"param2moe", "sarvam_moe"}  # query_key_value split into q_, k_ and v_proj
_LOADED_AS["granitemoeshared"] = _LOADED_AS["granitemoehybrid"]  # the same experts, shared MLP
_LOADED_AS["exaone_moe"] = [
    (r"\.mlp\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias")
]
# save_pretrained writes the hub's names, which loading converts (conversion_mapping.py)
_LOADED_AS["laguna"] = [
    (r"\.mlp\.experts\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),
]
_LOADED_AS["mimo_v2_flash"] = [(r"\.self_attn\.attention_sink_bias$", ".self_attn.sinks")]
# transformers loads per-expert tensors into one [experts, 2 * inter, hidden] gate_up_proj
# ([gate | up] rows) and one [experts, hidden, inter] down_proj
_PER_EXPERT = re.compile(
    r"^(?P<base>.*\.experts)\.(?P<e>\d+)\.(?P<part>w1|w3|w2|gate_proj|up_proj|down_proj)\.weight$"
)
_EXPERT_PART = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1}


def _loaded_as(family: str, name: str) -> str:
    for pattern, replacement in _LOADED_AS.get(family, []):
        name = re.sub(pattern, replacement, name)
    return name


# a norm's parameter: gpt2 names its LayerNorms ln_1, ln_2, ln_f; dbrx's attention sits
# inside norm_attn_norm, which is not a norm
_NORM = re.compile(r"(norm|(^|\.)ln_)[^.]*\.[^.]+$")


def _family_ckpt(tmp: Path, family: str, **overrides: Any) -> Path:
    return write_tiny_checkpoint(tmp / family, family, **{**_BIAS.get(family, {}), **overrides})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("ckpts")
    return {family: _family_ckpt(tmp, family) for family in FAMILIES}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_round_trips(ckpts: dict[str, Path], family: str) -> None:
    ckpt = ckpts[family]
    model, info = AutoModelForCausalLM.from_pretrained(ckpt, output_loading_info=True)
    assert not any(info.values()), info
    assert model.config.model_type == family
    tensors = load_file(ckpt / "model.safetensors")
    assert {t.dtype for t in tensors.values()} == {np.dtype(np.float32)}
    state = model.state_dict()
    for name, value in tensors.items():
        loaded = _loaded_value(state, family, _loaded_as(family, name), tensors)
        np.testing.assert_array_equal(loaded, value, err_msg=name)


def _loaded_value(state: dict, family: str, name: str, tensors: dict) -> np.ndarray:
    if family in _JOINED_ON_LOAD and re.search(_JOINED_ON_LOAD[family][0], name):
        pattern, parts, joined = _JOINED_ON_LOAD[family]
        part = re.search(pattern, name)["part"]
        before = parts[: parts.index(part)]
        start = sum(len(tensors[re.sub(pattern, f".{p}_conv1d.weight", name)]) for p in before)
        value = state[re.sub(pattern, joined, name)].numpy()
        return value[start : start + len(tensors[name])]
    if family in _SPLIT_ON_LOAD and re.search(_SPLIT_ON_LOAD[family][0], name):
        pattern, parts = _SPLIT_ON_LOAD[family]
        return np.concatenate([state[re.sub(pattern, part, name)].numpy() for part in parts])
    if family in _SPLIT_QKV and ".query_key_value." in name:
        parts = (name.replace("query_key_value", f"{p}_proj") for p in "qkv")
        return np.concatenate([state[part].numpy() for part in parts])
    match = _PER_EXPERT.match(name)
    if match is None:
        return state[name].numpy()
    expert = int(match["e"])
    if match["part"] in _EXPERT_PART:
        fused = state[f"{match['base']}.gate_up_proj"][expert].numpy()
        half = fused.shape[0] // 2
        return fused[:half] if _EXPERT_PART[match["part"]] == 0 else fused[half:]
    return state[f"{match['base']}.down_proj"][expert].numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_biases_random_and_norms_near_one(ckpts: dict[str, Path], family: str) -> None:
    tensors = load_file(ckpts[family] / "model.safetensors")
    biases = {k: v for k, v in tensors.items() if k.endswith(".bias")}
    if family not in _NO_BIAS:
        assert biases
    for name, value in biases.items():
        assert np.all(value != 0), name
    norms = {k: v for k, v in tensors.items() if _NORM.search(k)}
    assert bool(norms) != (family in _NO_NORM_WEIGHTS)
    for name, value in norms.items():
        assert not np.allclose(value, 1.0), name
        assert abs(float(value.mean()) - 1.0) < 0.1, name
    assert min(float(v.std()) for v in tensors.values() if v.ndim == 2) > 0.1


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path) -> None:
    a = load_file(write_tiny_checkpoint(tmp_path / "a", "qwen2", seed=3) / "model.safetensors")
    b = load_file(write_tiny_checkpoint(tmp_path / "b", "qwen2", seed=3) / "model.safetensors")
    c = load_file(write_tiny_checkpoint(tmp_path / "c", "qwen2", seed=4) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[name], c[name]) for name in a)


def test_qwen3_head_dim_differs_from_hidden_over_heads(ckpts: dict[str, Path]) -> None:
    config = json.loads((ckpts["qwen3"] / "config.json").read_text())
    assert config["head_dim"] == 32 != config["hidden_size"] // config["num_attention_heads"]
    tensors = load_file(ckpts["qwen3"] / "model.safetensors")
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 32, 64)
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (32,)


def test_overrides_reach_the_config(tmp_path: Path) -> None:
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    ckpt = write_tiny_checkpoint(tmp_path / "l", "llama", rope_scaling=rope, rope_theta=5e5)
    config = load_reference_model(ckpt).config
    params = config.rope_parameters
    assert params["rope_type"] == "llama3" and params["factor"] == 8.0
    assert params["rope_theta"] == 5e5

    ckpt = write_tiny_checkpoint(tmp_path / "m", "mistral", sliding_window=5)
    assert load_reference_model(ckpt).config.sliding_window == 5

    ckpt = write_tiny_checkpoint(tmp_path / "t", "qwen2", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(ckpt / "model.safetensors")
    model = load_reference_model(ckpt)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_hub_layout_config(tmp_path: Path) -> None:
    rope = {"rope_type": "linear", "factor": 2.0}
    ckpt = write_tiny_checkpoint(tmp_path / "h", "llama", hub_layout=True, rope_scaling=rope)
    data = json.loads((ckpt / "config.json").read_text())
    assert data["torch_dtype"] == "float32" and "dtype" not in data
    assert data["rope_theta"] == 10000.0 and "rope_parameters" not in data
    assert data["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    plain = write_tiny_checkpoint(tmp_path / "p", "qwen2", hub_layout=True)
    assert json.loads((plain / "config.json").read_text())["rope_scaling"] is None


_PARITY_CASES = [
    ("llama", {"attention_bias": True}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("mistral", {"sliding_window": 5}),
    ("qwen2", {}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    ("qwen3", {}),
]


@pytest.mark.parametrize(("family", "overrides"), _PARITY_CASES)
def test_decode_steps_match_full_recompute(
    tmp_path: Path, family: str, overrides: dict[str, Any]
) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / family, family, seed=1, **overrides)
    prompt = np.array([[5, 17, 33, 8, 99, 3, 41], [9, 9, 120, 64, 2, 77, 12]], dtype=np.int64)
    run = hf_reference_logits(ckpt, prompt, decode_steps=4)

    assert len(run.steps) == 5
    assert run.prefill.logits.shape == (2, 7, 128)
    assert all(s.logits.shape == (2, 1, 128) for s in run.decode)
    assert run.fed_tokens.shape == (2, 4)
    for prev, step in zip(run.steps, run.decode, strict=False):
        np.testing.assert_array_equal(step.input_ids[:, 0], prev.logits[:, -1].argmax(-1))
    assert run.decode[-1].attention_mask.shape == (2, 7 + 4)
    np.testing.assert_array_equal(run.decode[-1].position_ids, [[10], [10]])

    full = np.concatenate([prompt, run.fed_tokens], axis=1)
    with torch.no_grad():
        ref = load_reference_model(ckpt)(input_ids=torch.from_numpy(full)).logits.numpy()
    got = np.concatenate(run.logits, axis=1)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    assert len(np.unique(ref.argmax(-1))) > 3  # not degenerate


def test_left_padding_matches_unpadded(ckpts: dict[str, Path]) -> None:
    ckpt = ckpts["qwen2"]
    short = np.array([[11, 22, 33]], dtype=np.int64)
    batch = np.array([[0, 0, 11, 22, 33], [1, 2, 3, 4, 5]], dtype=np.int64)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=np.int64)
    padded = hf_reference_logits(ckpt, batch, decode_steps=3, attention_mask=mask)
    alone = hf_reference_logits(ckpt, short, decode_steps=3)

    np.testing.assert_array_equal(padded.prefill.position_ids, [[1, 1, 0, 1, 2], [0, 1, 2, 3, 4]])
    np.testing.assert_allclose(
        padded.prefill.logits[0, 2:], alone.prefill.logits[0], atol=ATOL, rtol=0
    )
    np.testing.assert_array_equal(padded.fed_tokens[0], alone.fed_tokens[0])
    for p, a in zip(padded.decode, alone.decode, strict=True):
        np.testing.assert_allclose(p.logits[0], a.logits[0], atol=ATOL, rtol=0)


def test_positions_from_mask() -> None:
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(positions_from_mask(mask, 1), [[2], [3]])
    np.testing.assert_array_equal(positions_from_mask(mask, 4), [[1, 0, 1, 2], [0, 1, 2, 3]])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_tokens_match_generate(ckpts: dict[str, Path], family: str) -> None:
    ckpt = ckpts[family]
    prompt = [5, 17, 33, 8]
    tokens = hf_greedy_tokens(ckpt, prompt, max_new_tokens=12, stop_at_eos=False)
    assert len(tokens) == 12
    model = load_reference_model(ckpt)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert out[0, len(prompt) :].tolist() == tokens
    run = hf_reference_logits(ckpt, np.array([prompt]), decode_steps=11)
    assert run.fed_tokens[0].tolist() == tokens[:11]


def test_greedy_stops_after_eos(ckpts: dict[str, Path]) -> None:
    ckpt = ckpts["llama"]
    free = hf_greedy_tokens(ckpt, [5, 17], max_new_tokens=6, stop_at_eos=False)
    eos_ckpt = ckpt.parent / "llama-eos"
    shutil.copytree(ckpt, eos_ckpt)
    gen = json.loads((eos_ckpt / "generation_config.json").read_text())
    gen["eos_token_id"] = [free[2]]
    (eos_ckpt / "generation_config.json").write_text(json.dumps(gen))
    stopped = hf_greedy_tokens(eos_ckpt, [5, 17], max_new_tokens=6)
    assert stopped == free[: free.index(free[2]) + 1]


# --- the committed tiny-qwen2 fixture (tests/data/make_tiny_model.py) ---


def test_tiny_qwen2_loads_without_missing_keys() -> None:
    model, info = AutoModelForCausalLM.from_pretrained(TINY_QWEN2, output_loading_info=True)
    assert not any(info.values()), info
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.bfloat16
    config = json.loads((TINY_QWEN2 / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["rope_scaling"] is None
    assert "rope_parameters" not in config and "dtype" not in config
    assert config["use_sliding_window"] is False
    assert model.config.sliding_window is None  # the config's window must be ignored
    tensors = load_torch_file(TINY_QWEN2 / "model.safetensors")  # bf16: numpy can't load it
    assert "lm_head.weight" not in tensors
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert all(bool(torch.all(v != 0)) for k, v in tensors.items() if k.endswith(".bias"))
    assert (TINY_QWEN2 / "model.safetensors").stat().st_size < 400_000


def test_tiny_qwen2_tokenizer_round_trips() -> None:
    tok = AutoTokenizer.from_pretrained(TINY_QWEN2)
    config = json.loads((TINY_QWEN2 / "config.json").read_text())
    assert len(tok) == config["vocab_size"]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"]
    assert tok.pad_token == "<|endoftext|>"
    for text in [
        "Hello world! The capital of France is Paris.",
        "def f(x):\n    return 42",
        "東京 🙂",
    ]:
        assert tok.decode(tok(text)["input_ids"]) == text
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(chat)["input_ids"]
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3


def test_tiny_qwen2_is_reproducible(tmp_path: Path) -> None:
    """The committed files match a fresh run of the generator script.

    Tokenizer files are left out: their bytes depend on the tokenizers version's trainer and
    serializer; the vocabulary size they imply is checked through config.json instead.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "make_tiny_model", TINY_QWEN2.parent / "make_tiny_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.write_tiny_qwen2(tmp_path / "tiny-qwen2")
    names = {p.name for p in TINY_QWEN2.iterdir()}
    assert names == {p.name for p in out.iterdir()}
    for name in sorted(names - {"tokenizer.json", "vocab.json", "merges.txt"}):
        assert (out / name).read_bytes() == (TINY_QWEN2 / name).read_bytes(), name


def test_tiny_qwen2_tokenizer_loads_in_onnxruntime_genai(tmp_path: Path) -> None:
    """og.Tokenizer reads tokenizer.json/tokenizer_config.json next to a genai_config.json."""
    og = pytest.importorskip("onnxruntime_genai")
    config = json.loads((TINY_QWEN2 / "config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(TINY_QWEN2 / name, tmp_path / name)
    genai_config = {
        "model": {
            "type": "qwen2",
            "context_length": config["max_position_embeddings"],
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["bos_token_id"],
            "vocab_size": config["vocab_size"],
            "decoder": {
                "filename": "model.onnx",  # never opened: only the tokenizer is built
                "head_size": 16,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "num_key_value_heads": 2,
            },
        },
        "search": {"max_length": config["max_position_embeddings"]},
    }
    (tmp_path / "genai_config.json").write_text(json.dumps(genai_config))
    og_tok = og.Tokenizer(str(tmp_path))
    hf_tok = AutoTokenizer.from_pretrained(TINY_QWEN2)
    # NFC-composed text only: onnxruntime-genai skips tokenizer.json's NFC normalizer.
    for text in ["Hello world! Paris 12345.", "<|im_start|>user\nHi<|im_end|>\n", "Café 東京 🙂"]:
        ids = hf_tok(text)["input_ids"]
        assert [int(i) for i in og_tok.encode(text)] == ids, text
    text = "The quick brown fox, 東京 🙂"
    assert og_tok.decode(og_tok.encode(text)) == text
