"""Keys of the metadata a built graph carries (`ModelProto.metadata_props`).

Kept apart from the builder so that readers of a bundle (the validator, the smoke test's own
process) can name them without importing the graph-building stack.
"""

#: The EP a graph was built for (its capabilities' name).
BUILT_FOR_KEY = "mobius_genai.execution_provider"

#: The positions a decoder graph was built for (its rotary tables' rows; the bundle's context).
CONTEXT_LENGTH_KEY = "mobius_genai.context_length"

#: Marks a node that keeps each sequence's last position only (`PruneLmHeadPass`'s gathers):
#: what follows works row by row, so a pass wanting every position's rows may skip it.
LAST_TOKEN_KEY = "mobius_genai.last_token"

#: A decoder's LoRA inputs (components/lora.py): ``<module>.lora_A`` [in, rank] and
#: ``<module>.lora_B`` [rank, out], the rank axis symbolic (what og.Adapters feeds).
LORA_A, LORA_B, LORA_RANK = "lora_A", "lora_B", "lora_rank"
