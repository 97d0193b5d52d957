"""Packaging: a built model → a checked onnxruntime-genai bundle folder, and checks of bundles."""

from mobius_genai.bundle.bundle import TOKENIZER_FILES, staged_output
from mobius_genai.bundle.genai_config import make_genai_config
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.manifest import make_manifest
from mobius_genai.bundle.packager import package, write_bundle
from mobius_genai.bundle.schema import validate_genai_config, validate_manifest
from mobius_genai.bundle.smoke import SmokeResult, smoke_test
from mobius_genai.bundle.validate import BundleReport, validate_bundle

__all__ = [
    "TOKENIZER_FILES",
    "BundleReport",
    "GraphInfo",
    "SmokeResult",
    "make_genai_config",
    "make_manifest",
    "package",
    "smoke_test",
    "staged_output",
    "validate_bundle",
    "validate_genai_config",
    "validate_manifest",
    "write_bundle",
]
