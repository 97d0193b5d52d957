"""Tasks: the graph I/O contract a runtime expects of a model."""

from mobius_genai.tasks.causal_lm import CausalLMTask

__all__ = ["CausalLMTask"]
