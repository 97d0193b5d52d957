"""README.md of a bundle: what was built and how to run it, from templates/bundle_README.md.

Rendered with string.Template (no template engine dependency); every value comes from the
genai_config and the manifest's build section, so the card cannot disagree with the bundle, and
what runs the bundle from the EP's `RuntimeInfo` (its registry entry).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from mobius_genai import _resources
from mobius_genai.bundle.mtp_config import DRAFT_TOKENS
from mobius_genai.bundle.og_support import APIS
from mobius_genai.bundle.runnable import dtype_refusal
from mobius_genai.ep import RuntimeInfo, ep_registry
from mobius_genai.kinds.og_types import AUDIO_PROCESSOR_FILE, og_type, whisper_prompt
from mobius_genai.target import FLOAT_PRECISIONS

TEMPLATE = "templates/bundle_README.md"
CARD_FILENAME = "README.md"

#: The graphs of a bundle in the order onnxruntime-genai runs them (genai_config sections).
GRAPH_SECTIONS = ("encoder", "vision", "speech", "embedding", "decoder", "mtp")


def graph_sections(model: Mapping[str, Any]) -> list[str]:
    """The sections of genai_config's model that name a graph, in `GRAPH_SECTIONS` order (a
    gemma4 speech section without a file names none)."""
    return [name for name in GRAPH_SECTIONS if model.get(name, {}).get("filename")]


#: What each well-known bundle file is, for the card's file table.
FILE_ROLES: Mapping[str, str] = {
    "model.onnx": "the decoder graph",
    "model.onnx.data": "the decoder's weights (ONNX external data)",
    "mtp.onnx": "the multi-token-prediction head (og.MtpGenerator's draft model)",
    "mtp.onnx.data": "the MTP head's weights (ONNX external data)",
    "genai_config.json": "how onnxruntime-genai runs the graph",
    "tokenizer.json": "tokenizer",
    "tokenizer_config.json": "tokenizer settings and chat template",
    "special_tokens_map.json": "special tokens",
    "added_tokens.json": "added tokens",
    "chat_template.jinja": "chat template",
    "chat_template.json": "chat template",
    "generation_config.json": "the checkpoint's generation defaults",
    "vocab.json": "tokenizer vocabulary",
    "merges.txt": "tokenizer merges",
    "tokenizer.model": "SentencePiece tokenizer",
    "mobius_manifest.json": "provenance and checksums",
    "vision.onnx": "the vision graph (image → image features)",
    "vision.onnx.data": "the vision graph's weights (ONNX external data)",
    "embedding.onnx": "the embedding graph (token ids and image features → embeddings)",
    "embedding.onnx.data": "the embedding graph's weights (ONNX external data)",
    "decoder.onnx": "the decoder graph",
    "decoder.onnx.data": "the decoder's weights (ONNX external data)",
    "processor_config.json": "the image processor's transforms (onnxruntime-extensions)",
    "speech.onnx": "the audio tower (log-mel → audio features, placed at the audio tokens)",
    "speech.onnx.data": "the audio tower's weights (ONNX external data)",
    "encoder.onnx": "the audio encoder graph (log-mel → cross-attention keys and values)",
    "encoder.onnx.data": "the encoder's weights (ONNX external data)",
    AUDIO_PROCESSOR_FILE: "the audio processor's feature extraction (onnxruntime-extensions)",
    CARD_FILENAME: "this card",
}


def render_card(
    genai_config: Mapping[str, Any],
    *,
    folder: str,
    model_id: str,
    revision: str | None,
    build: Mapping[str, Any],
    tool_version: str,
    files: list[str],
    bos_token_id: int | None = None,
) -> str:
    """The README.md text of a bundle named `folder` holding `files`; `bos_token_id` is the
    token its tokenizer asks to start every encoding with (`bos.required_bos`), which the
    example adds because onnxruntime-genai's tokenizer does not."""
    model = genai_config["model"]
    decoder = model["decoder"]
    providers = decoder.get("session_options", {}).get("provider_options", [])
    names = [name for entry in providers for name in entry]
    provider = ", ".join(f"`{name}`" for name in names) or "CPU"
    share = genai_config.get("search", {}).get("past_present_share_buffer", False)
    rules = build.get("optimization") or {}
    values = {
        "title": f"{Path(model_id).name} for {build['execution_provider']} ({build['precision']})",
        "model_id": model_id,
        "revision": f"`{revision}`" if revision else "not recorded",
        "tool_version": tool_version,
        "execution_provider": build["execution_provider"],
        "provider": f"onnxruntime-genai provider {provider}",
        "dtype": build["dtype"],
        "precision": build["precision"],
        "context_length": model["context_length"],
        "model_type": build["model_type"],
        "genai_type": model["type"],
        "num_layers": decoder["num_hidden_layers"],
        "num_heads": decoder["num_attention_heads"],
        "num_kv_heads": decoder["num_key_value_heads"],
        "head_size": decoder["head_size"],
        "vocab_size": model.get("vocab_size", "?"),
        "attention": (
            "GroupQueryAttention, past/present KV buffer shared"
            if share
            else "KV cache grows by concatenation"
        ),
        "quantization": _prequantized(build.get("prequantized"))
        or _quantization(build.get("quantization")),
        "smoke_test": _smoke_test(build.get("smoke_test")),
        "og_apis": _og_apis(build.get("og_limits")),
        "rules": ", ".join(f"{name} ×{count}" for name, count in sorted(rules.items())) or "none",
        "folder": folder,
        "graphs": _graphs(model)
        + (f"; not built: {build['not_built']}" if build.get("not_built") else ""),
        "cli_run": _cli_run(folder, model),
        "requirements": _requirements(
            _runtime(build["execution_provider"], names), FLOAT_PRECISIONS.get(build["dtype"])
        ),
        "feed": _feed(model, bos_token_id),
        "bos_note": _bos_note(bos_token_id),
        "adapters": _adapters(build.get("lora"), folder),
        "mtp": _mtp(model, build.get("smoke_test"), folder),
        "files": "\n".join(f"| `{name}` | {_file_role(name)} |" for name in files),
    }
    return string.Template(_resources.read_text(TEMPLATE)).substitute(values)


def _cli_run(folder: str, model: Mapping[str, Any]) -> str:
    """The command line that runs the bundle: with an image, or audio for a speech bundle."""
    if og_type(model["type"]).audio:
        return (
            f"mobius-genai run {folder} --audio speech.wav --language en\n"
            f"mobius-genai run {folder} --audio speech.wav --timestamps  # [0.00 -> 2.40] text"
        )
    run = f'mobius-genai run {folder} --prompt "The capital of France is"'
    if "vision" in model:
        run += f'\nmobius-genai run {folder} --image photo.png --prompt "Describe the image."'
    if "speech" in graph_sections(model):
        run += f'\nmobius-genai run {folder} --audio clip.wav --prompt "Transcribe the audio."'
    return run


def _feed(model: Mapping[str, Any], bos_token_id: int | None) -> str:
    """The example's prompt into the generator: token ids, or a speech bundle's audio through
    og's processor."""
    if og_type(model["type"]).audio:
        prompt = whisper_prompt(model.get("vocab_size", 0))
        return (
            "processor = model.create_multimodal_processor()\n"
            f'generator.set_inputs(processor("{prompt}", audios=og.Audios.open("speech.wav")))'
        )
    return f"generator.append_tokens({_encode(bos_token_id)})"


def _file_role(name: str) -> str:
    if name.startswith("adapters/"):
        return "a LoRA adapter (onnxruntime adapter format, for og.Adapters)"
    return FILE_ROLES.get(name, "")


def _mtp(model: Mapping[str, Any], smoke: Mapping[str, Any] | None, folder: str) -> str:
    """The card's MTP section: how og.MtpGenerator runs the head, its drafts per round and the
    acceptance the smoke test measured."""
    if "mtp" not in model:
        return ""
    measured = (smoke or {}).get("mtp")
    if measured is None:
        drafts, accepted = DRAFT_TOKENS, "not measured (no smoke test ran it)"
    else:
        drafts = measured["draft_tokens"]
        rate = measured["accepted"] / measured["evaluated"] if measured["evaluated"] else 0.0
        accepted = (
            f"{measured['accepted']} of {measured['evaluated']} drafts evaluated ({rate:.0%}) "
            "on the smoke prompt"
        )
        if not measured["same_tokens"]:
            accepted += "; its tokens differed from og.Generator's there (a near-tie)"
    return (
        "\n## Multi-token prediction\n\n"
        f"`{model['mtp']['filename']}` drafts up to {drafts} tokens per round that the decoder "
        f"verifies in one pass (greedy tokens unchanged). Accepted: {accepted}.\n\n"
        "```python\n"
        f'mtp = json.load(open("{folder}/genai_config.json"))["model"]["mtp"]\n'
        'head = {key: mtp[key] for key in mtp if key not in ("main_hidden_states", "enabled")}\n'
        f'config = og.Config("{folder}")  # the head: the mtp section as the decoder\n'
        'config.overlay(json.dumps({"model": {"decoder": head}}))\n'
        "generator = og.MtpGenerator(model, og.Model(config), params)\n```\n\n"
        f"`mobius-genai run {folder}` uses it; `--no-mtp` decodes without it.\n"
    )


def _adapters(lora: Mapping[str, Any] | None, folder: str) -> str:
    """The card's LoRA section: what the graph accepts, each adapter and how to activate it."""
    if not lora:
        return ""
    listed = "\n".join(
        f"| `{name}` | `{entry['file']}` | {entry['rank']} | {', '.join(entry['targets'])} |"
        for name, entry in sorted(lora["adapters"].items())
    )
    table = "| Adapter | File | Rank | Target modules |\n|---|---|---|---|\n" + listed
    example = next(iter(sorted(lora["adapters"])), "NAME")
    return (
        "\n## LoRA adapters\n\n"
        f"The decoder takes LoRA weights as inputs for {', '.join(lora['targets'])} "
        f"({lora['modules']} projections, {lora['dtype']}, any rank); with no adapter active it "
        "is the base model.\n\n"
        + (table + "\n\n" if lora["adapters"] else "")
        + "```python\nadapters = og.Adapters(model)\n"
        f'adapters.load("{folder}/adapters/{example}.onnx_adapter", "{example}")\n'
        f'generator.set_active_adapter(adapters, "{example}")  # after og.Generator(...)\n```\n\n'
        f"`mobius-genai run {folder} --adapter {example}`; `mobius-genai adapter PEFT_DIR "
        f"--bundle {folder} -o FILE` converts another adapter for this bundle.\n"
    )


def _encode(bos_token_id: int | None) -> str:
    encode = 'tokenizer.encode("The capital of France is")'
    return encode if bos_token_id is None else f"[{bos_token_id}, *{encode}]"


def _bos_note(bos_token_id: int | None) -> str:
    if bos_token_id is None:
        return ""
    return (
        f"\nThe tokenizer asks for token {bos_token_id} (its bos token, tokenizer_config.json's "
        "`add_bos_token`) at the start of every prompt, and onnxruntime-genai's "
        "`tokenizer.encode` does not add it: put it in front of the ids yourself, as above, "
        "unless the text already starts with it (a chat template that writes the bos token). "
        "`mobius-genai run` does this.\n"
    )


def _graphs(model: Mapping[str, Any]) -> str:
    """Each graph's file and role; beside the decoder, the inputs and outputs that link them."""
    described = []
    for section in graph_sections(model):
        entry = model[section]
        role = section
        if section != "decoder":
            inputs = ", ".join(entry.get("inputs", {}).values())
            role += f": {inputs} → {', '.join(entry.get('outputs', {}).values())}"
        described.append(f"`{entry['filename']}` ({role})")
    return ", ".join(described)


#: Linux CPU tip: decoding reads every weight once per token, so 2 MiB pages make it faster.
HUGE_PAGES_TIP = (
    "On Linux, where `/sys/kernel/mm/transparent_hugepage/enabled` says `[madvise]`, start the "
    "program with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc 2.35 or later): the weights "
    "then sit in 2 MiB pages, and decoding, which reads every weight once per new token, gets "
    "faster."
)


def _runtime(execution_provider: str, providers: list[str]) -> RuntimeInfo:
    """The build EP's runtime; an EP not registered in this process gets the bare facts of its
    genai_config (its first provider, or none: CPU)."""
    caps = ep_registry.get(execution_provider)
    if caps is not None:
        return caps.runtime
    return RuntimeInfo(genai_provider=providers[0] if providers else None)


def _requirements(runtime: RuntimeInfo, dtype: ir.DataType | None) -> str:
    """What runs the bundle; for one that runs on CPU, what runs it instead where onnxruntime's
    CPU provider has no kernels for its dtype (`runnable.dtype_refusal`)."""
    if runtime.package is not None:
        needs = f"`pip install {runtime.package}`"
    else:
        needs = f"an onnxruntime-genai build with the `{runtime.genai_provider}` execution provider"
    refusal = dtype_refusal(dtype) if runtime.genai_provider is None else None
    if refusal is not None:
        return f"Needs {needs}, but {refusal}."
    tip = HUGE_PAGES_TIP if runtime.genai_provider is None else ""
    return " ".join(part for part in (f"Needs {needs}.", runtime.card_note, tip) if part)


#: What the dot products of a pre-quantized source's MatMulNBits compute in at an accuracy level
#: and what the other choice costs (onnxruntime 1.32's cpu kernels; benchmarks/README.md,
#: "Packaging a GGUF": SmolLM2-135M's Q4_1 GGUF with its Q8_0 lm_head). Levels 1-3 round
#: the activations to a float type.
_LEVELS = {
    0: (
        "dot products in float, exact to the stored integers; on cpu, level 4 (the EP's "
        "default: activations rounded to int8) decoded SmolLM2-135M's GGUF bundle ~12x as fast"
    ),
    1: "activations in a float type in the dot products",
    4: (
        "activations rounded to int8 in the dot products, as llama.cpp computes them; "
        "`--int4-accuracy-level 0` keeps them float, exact to the stored integers, but "
        "onnxruntime has no fast 8-bit kernel there: SmolLM2-135M's GGUF bundle decoded "
        "~12x slower on cpu"
    ),
}


def _prequantized(summary: Mapping[str, Any] | None) -> str:
    """The card's words for a pre-quantized source, empty when the source was float."""
    if not summary:
        return ""
    bits = "/".join(map(str, summary["bits"])) or "no"
    blocks = "/".join(map(str, summary["block_sizes"])) or "none"
    level = summary["accuracy_level"]
    if summary["weights"] or summary.get("lookups"):
        words = (
            f"pre-quantized source ({summary['scheme']}): {summary['weights']} weights kept as "
            f"stored, no second rounding (MatMulNBits {bits}-bit, block size {blocks}, accuracy "
            f"level {level}: {_LEVELS.get(level, _LEVELS[1])})"
        )
    else:
        words = f"pre-quantized source ({summary['scheme']}), dequantized: a float bundle"
    if summary.get("lookups"):
        words += f", {summary['lookups']} embedding lookup(s) from the stored integers"
    if summary["act_order_gathers"]:
        words += f", {summary['act_order_gathers']} act-order input gathers"
    if summary["dequantized"]:
        words += f", {len(summary['dequantized'])} dequantized to float"
    kinds = summary.get("tensors") or {}
    if kinds:
        words += "; source tensors: " + ", ".join(
            f"{kind}: {count} {outcome}"
            for kind, outcomes in kinds.items()
            for outcome, count in outcomes.items()
        )
    return words


def _og_apis(limits: Mapping[str, str] | None) -> str:
    """The card's line for the manifest's `og_limits`: what og 0.18 runs, and what it refuses
    and why (APIs refused for one reason together)."""
    runs = "og.Generator (greedy, sampling, batches, guidance, a prompt appended in parts)"
    if limits is None:
        return f"{runs}; not recorded for the others"
    if not limits:
        return f"{runs}, {', '.join(APIS)}: every 0.18 API"
    by_reason: dict[str, list[str]] = {}
    for api, reason in limits.items():
        by_reason.setdefault(reason, []).append(api)
    others = [api for api in APIS if api not in limits]
    refused = "; ".join(f"{', '.join(apis)}: {reason}" for reason, apis in by_reason.items())
    return f"{', '.join([runs, *others])}. **Not**: {refused}".replace("|", "\\|")


def _smoke_test(record: Mapping[str, Any] | None) -> str:
    """The card's line for the manifest's smoke test record (its note says more)."""
    if not record:
        return "not run"
    if not record["ran"]:
        return record["note"].replace("|", "\\|")
    if record["layers"] == record["of"]:
        return "passed: onnxruntime-genai generated from the whole bundle"
    scope = f"first {record['layers']} of {record['of']} layers"
    if "vision_layers" in record:
        scope += f" and {record['vision_layers']['layers']} of {record['vision_layers']['of']} "
        scope += "vision layers"
    return (
        f"passed on a twin of the bundle with its {scope}, built the same way "
        f"({record.get('reason', 'the whole bundle was not run')})"
    )


def _quantization(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "none"
    level = summary.get("accuracy_level")
    wide = summary.get("weights_8bit") or []
    kept = summary.get("weights_float32") or []
    parts = [
        f"INT4 {summary['format']}",
        f"quality {summary['quality']} ({summary['rounding']} rounding)",
        f"block size {summary['block_size']}",
        "symmetric" if summary["symmetric"] else "asymmetric (zero points)",
        f"{summary['quantized_weights']} weights"
        + (f" ({len(wide)} in 8 bits)" if wide else "")
        + (f", {len(kept)} left float32 as the family keeps them" if kept else ""),
        f"embedding {summary['embedding']}",
    ]
    if level is not None:
        parts.insert(4, f"accuracy level {level}")
    calibration = summary.get("calibration")
    if calibration:
        parts[1] = (
            f"quality {summary['quality']} ({summary['rounding']} rounding weighted by the "
            f"activations of {calibration['tokens']} random tokens, seed {calibration['seed']})"
        )
    skipped = summary.get("calibration_skipped")
    if skipped:
        parts[1] = (
            f"quality {summary['quality']} ({summary['rounding']} rounding, not "
            f"activation-weighted: {skipped})"
        )
    return ", ".join(parts)
