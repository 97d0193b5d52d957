"""README.md of a bundle: what was built and how to run it, from templates/bundle_README.md.

Rendered with string.Template (no template engine dependency); every value comes from the
genai_config and the manifest's build section, so the card cannot disagree with the bundle.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai import _resources

TEMPLATE = "templates/bundle_README.md"
CARD_FILENAME = "README.md"

#: What each well-known bundle file is, for the card's file table.
FILE_ROLES: Mapping[str, str] = {
    "model.onnx": "the decoder graph",
    "model.onnx.data": "the decoder's weights (ONNX external data)",
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
) -> str:
    """The README.md text of a bundle named `folder` holding `files`."""
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
        "quantization": _quantization(build.get("quantization")),
        "smoke_test": _smoke_test(build.get("smoke_test")),
        "rules": ", ".join(f"{name} ×{count}" for name, count in sorted(rules.items())) or "none",
        "folder": folder,
        "requirements": _requirements(names),
        "files": "\n".join(f"| `{name}` | {FILE_ROLES.get(name, '')} |" for name in files),
    }
    return string.Template(_resources.read_text(TEMPLATE)).substitute(values)


#: Linux CPU tip: decoding reads every weight once per token, so 2 MiB pages make it faster.
HUGE_PAGES_TIP = (
    "On Linux, where `/sys/kernel/mm/transparent_hugepage/enabled` says `[madvise]`, start the "
    "program with `GLIBC_TUNABLES=glibc.malloc.hugetlb=1` (glibc 2.35 or later): the weights "
    "then sit in 2 MiB pages, and decoding, which reads every weight once per new token, gets "
    "faster."
)


#: What each onnxruntime-genai provider needs installed, by its genai_config name.
RUNTIMES: Mapping[str, str] = {
    "cuda": "the CUDA build of onnxruntime-genai (`pip install onnxruntime-genai-cuda`, CUDA 12)",
    "dml": (
        "the DirectML build of onnxruntime-genai, on Windows "
        "(`pip install onnxruntime-genai-directml`)"
    ),
    "webgpu": "an onnxruntime-genai build with the WebGPU execution provider",
    "NvTensorRtRtx": (
        "an onnxruntime-genai build with NVIDIA's TensorRT-RTX execution provider (NvTensorRtRtx)"
    ),
    "MLXExecutionProvider": (
        "onnxruntime-genai and the MLX plugin execution provider, registered before the model "
        'is loaded: `og.register_execution_provider_library("MLXExecutionProvider", '
        '"/path/to/the/MLX/plugin/library")`'
    ),
}


def _requirements(providers: list[str]) -> str:
    if not providers:
        return f"Needs `pip install onnxruntime-genai`. {HUGE_PAGES_TIP}"
    needs = "; ".join(
        RUNTIMES.get(name, f"an onnxruntime-genai build with the `{name}` execution provider")
        for name in providers
    )
    return f"Needs {needs}. The CPU-only wheel cannot load it."


def _smoke_test(record: Mapping[str, Any] | None) -> str:
    """The card's line for the manifest's smoke test record (its note says more)."""
    if not record:
        return "not run"
    if not record["ran"]:
        return record["note"].replace("|", "\\|")
    if record["layers"] == record["of"]:
        return "passed: onnxruntime-genai generated from the whole bundle"
    return (
        f"passed on a twin of the bundle with its first {record['layers']} of {record['of']} "
        f"layers, built the same way ({record.get('reason', 'the whole bundle was not run')})"
    )


def _quantization(summary: Mapping[str, Any] | None) -> str:
    if not summary:
        return "none"
    level = summary.get("accuracy_level")
    parts = [
        f"INT4 {summary['format']}",
        f"block size {summary['block_size']}",
        "symmetric" if summary["symmetric"] else "asymmetric (zero points)",
        f"{summary['quantized_weights']} weights",
        f"embedding {summary['embedding']}",
    ]
    if level is not None:
        parts.insert(3, f"accuracy level {level}")
    return ", ".join(parts)
