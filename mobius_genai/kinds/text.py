"""The text decoder kind: one graph, "model", from a row of the family table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobius_genai.checkpoint.weights import attach_weights
from mobius_genai.kinds.base import KindGraphs, KindInput
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import get_family
from mobius_genai.tasks.causal_lm import CausalLMTask

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage


class TextDecoderKind:
    """A decoder like the others (`models/families/`): every model_type no other kind claims;
    one the family table lacks is refused there, with the supported ones listed."""

    name = "text decoder"
    keeps_stored_integers = True

    def claims(self, model_type: str) -> bool:
        return True

    def build(self, given: KindInput) -> KindGraphs:
        family = get_family(given.raw.get("model_type", ""))
        config = family.parse_config(given.raw)
        if given.num_layers is not None:
            config = config.first_layers(given.num_layers)
        length = given.target.context_length or config.max_position_embeddings
        module = CausalLMModel(config, length)  # parameters are shapes, rotary tables lazy
        weights = given.read_decoder(module, family)  # config vs checkpoint: before the graph
        graph_model = CausalLMTask().build(module, config)
        attach_weights(graph_model, weights.tensors)
        return KindGraphs(
            graphs={"model": ("decoder", graph_model)},
            config=config,
            context_length=length,
            family=family,
            prequantized=weights.prequantized,
            float_kinds=weights.float_kinds,
            not_built=None if family.text_only is None else family.text_only.not_built,
        )

    def genai_type(self, package: ModelPackage) -> str:
        return package.family.genai_type

    def add_sections(self, genai_config: dict[str, Any], package: ModelPackage) -> None:
        return None

    def bundle_files(self, checkpoint: Path, package: ModelPackage) -> dict[str, Any]:
        return {}

    def twin_layers(self, package: ModelPackage) -> tuple[int, int] | None:
        return None
