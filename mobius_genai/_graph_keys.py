"""Keys of the metadata a built graph carries (`ModelProto.metadata_props`).

Kept apart from the builder so that readers of a bundle (the validator, the smoke test's own
process) can name them without importing the graph-building stack.
"""

#: The EP a graph was built for (its capabilities' name).
BUILT_FOR_KEY = "mobius_genai.execution_provider"
