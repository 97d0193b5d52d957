"""Model definitions and the model_type → family adapter registry."""

from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FAMILIES, FamilyAdapter, get_family

__all__ = ["FAMILIES", "CausalLMModel", "FamilyAdapter", "get_family"]
