"""A bundle folder: its files written (genai_config, card, manifest, tokenizer) and checked.

Names are imported on first use (`mobius_genai._lazy`), so the smoke test's own process loads
onnxruntime-genai without the graph-building stack.
"""

from mobius_genai._lazy import export_lazily

#: Public name → the module that defines it.
_EXPORTS = {
    "TOKENIZER_FILES": "mobius_genai.bundle.tokenizer_files",
    "staged_output": "mobius_genai.bundle.output_folder",
    "make_genai_config": "mobius_genai.bundle.genai_config",
    "GraphInfo": "mobius_genai.bundle.graph",
    "make_manifest": "mobius_genai.bundle.manifest",
    "validate_genai_config": "mobius_genai.bundle.schema",
    "validate_manifest": "mobius_genai.bundle.schema",
    "BundleReport": "mobius_genai.bundle.validate",
    "validate_bundle": "mobius_genai.bundle.validate",
}

__all__ = sorted(_EXPORTS)

export_lazily(__name__, _EXPORTS)
