"""Packaging: a built model → a checked onnxruntime-genai bundle folder, and checks of bundles.

Names are imported on first use (`mobius_genai._lazy`), so the smoke test's own process loads
onnxruntime-genai without the graph-building stack.
"""

from mobius_genai._lazy import export_lazily

#: Public name → the module that defines it.
_EXPORTS = {
    "TOKENIZER_FILES": "mobius_genai.bundle.bundle",
    "staged_output": "mobius_genai.bundle.bundle",
    "make_genai_config": "mobius_genai.bundle.genai_config",
    "GraphInfo": "mobius_genai.bundle.graph",
    "make_manifest": "mobius_genai.bundle.manifest",
    "package": "mobius_genai.bundle.packager",
    "write_bundle": "mobius_genai.bundle.packager",
    "validate_genai_config": "mobius_genai.bundle.schema",
    "validate_manifest": "mobius_genai.bundle.schema",
    "SmokeResult": "mobius_genai.bundle.smoke",
    "smoke_test": "mobius_genai.bundle.smoke",
    "BundleReport": "mobius_genai.bundle.validate",
    "validate_bundle": "mobius_genai.bundle.validate",
}

__all__ = sorted(_EXPORTS)

export_lazily(__name__, _EXPORTS)
