"""Family adapters: what distinguishes one checkpoint family from the generic decoder, as data.

An adapter holds the facts config.json leaves implicit (key aliases, transformers' defaults,
config overrides), the name onnxruntime-genai knows the family by, and how checkpoint tensors
map to graph parameters (renames, fused tensors split into parameters, matrices stored
[in, out], value changes such as gemma's `1 + weight` norms). `adapter` defines the row type,
`table` holds the rows; adding a family is adding a row there.
"""

from mobius_genai.models.families.adapter import ConfigValue, FamilyAdapter, FusedWeight
from mobius_genai.models.families.table import FAMILIES, get_family

__all__ = ["FAMILIES", "ConfigValue", "FamilyAdapter", "FusedWeight", "get_family"]
