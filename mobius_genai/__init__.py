"""mobius-genai: HuggingFace LLM checkpoints → ONNX Runtime GenAI bundles, per execution provider.

The public API lives here; everything else is internal and may change. Names other than the
errors are imported on first use (`_lazy`), so `import mobius_genai` is cheap.
"""

from mobius_genai._lazy import export_lazily
from mobius_genai.errors import (
    BundleError,
    ConfigError,
    ExecutionProviderError,
    MobiusError,
    UnsupportedModelError,
    WeightsError,
)

__version__ = "0.1.0"

#: Public name → the module that defines it.
_EXPORTS = {
    "ModelPackage": "mobius_genai.build",
    "build": "mobius_genai.build",
    "build_from_module": "mobius_genai.build",
    "package": "mobius_genai.packager",
    "bundle_og_limits": "mobius_genai.bundle.og_support",
    "engine_support": "mobius_genai.bundle.og_support",
    "ArchitectureConfig": "mobius_genai.config",
    "RopeConfig": "mobius_genai.config",
    "EpCapabilities": "mobius_genai.ep",
    "EpRegistry": "mobius_genai.ep",
    "RuntimeInfo": "mobius_genai.ep",
    "build_context": "mobius_genai.ep",
    "ep_capabilities": "mobius_genai.ep",
    "ep_registry": "mobius_genai.ep",
    "get_build_dtype": "mobius_genai.ep",
    "get_ep": "mobius_genai.ep",
    "register_ep": "mobius_genai.ep",
    "OptimizationReport": "mobius_genai.optimize",
    "optimize_model": "mobius_genai.optimize",
    "Target": "mobius_genai.target",
    "resolve_target": "mobius_genai.target",
    "video_inputs": "mobius_genai.runtime.video",
}

__all__ = [
    "BundleError",
    "ConfigError",
    "ExecutionProviderError",
    "MobiusError",
    "UnsupportedModelError",
    "WeightsError",
    "__version__",
    *_EXPORTS,
]

export_lazily(__name__, _EXPORTS)
