"""mobius-genai: HuggingFace LLM checkpoints → ONNX Runtime GenAI bundles, per execution provider.

The public API lives here; everything else is internal and may change.
"""

from mobius_genai.build import ModelPackage, build, build_from_module
from mobius_genai.bundle import package
from mobius_genai.config import ArchitectureConfig, RopeConfig
from mobius_genai.ep import (
    EpCapabilities,
    EpRegistry,
    RuntimeInfo,
    build_context,
    ep_capabilities,
    ep_registry,
    get_build_dtype,
    get_ep,
    register_ep,
)
from mobius_genai.errors import (
    BundleError,
    ConfigError,
    ExecutionProviderError,
    MobiusError,
    UnsupportedModelError,
    WeightsError,
)
from mobius_genai.optimize import OptimizationReport, optimize_model
from mobius_genai.target import Target, resolve_target

__version__ = "0.1.0"

__all__ = [
    "ArchitectureConfig",
    "BundleError",
    "ConfigError",
    "EpCapabilities",
    "EpRegistry",
    "ExecutionProviderError",
    "MobiusError",
    "ModelPackage",
    "OptimizationReport",
    "RopeConfig",
    "RuntimeInfo",
    "Target",
    "UnsupportedModelError",
    "WeightsError",
    "__version__",
    "build",
    "build_context",
    "build_from_module",
    "ep_capabilities",
    "ep_registry",
    "get_build_dtype",
    "get_ep",
    "optimize_model",
    "package",
    "register_ep",
    "resolve_target",
]
