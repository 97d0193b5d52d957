"""The text decoder kind: one graph, "model", from a row of the family table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobius_genai.bundle.genai_config import make_genai_config
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.mtp_config import with_mtp
from mobius_genai.bundle.tool_tokens import tool_token_ids
from mobius_genai.checkpoint.parameters import attach_weights
from mobius_genai.components.lora import add_lora
from mobius_genai.errors import OptionError
from mobius_genai.kinds.base import KindGraphs, KindInput, WrittenGraphs
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import get_family
from mobius_genai.models.families.float32 import keep_float32
from mobius_genai.models.mtp import has_mtp_head, mtp_graph
from mobius_genai.tasks.causal_lm import CausalLMTask

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage


#: The package key (and file stem: mtp.onnx, og's builder's name) of an MTP head's graph.
MTP_KEY = "mtp"


class TextDecoderKind:
    """A decoder like the others (`models/families/`): every model_type no other kind claims;
    one the family table lacks is refused there, with the supported ones listed."""

    name = "text decoder"

    def claims(self, model_type: str) -> bool:
        return True

    def build(self, given: KindInput) -> KindGraphs:
        family = get_family(given.raw.get("model_type", ""))
        config = family.parse_config(given.raw)
        if given.num_layers is not None:
            config = config.first_layers(given.num_layers)
        length = given.target.context_length or config.max_position_embeddings
        module = CausalLMModel(config, length)  # parameters are shapes, rotary tables lazy
        keep_float32(module, family.float32, family.checkpoint_name)
        add_lora(module, given.lora_targets)
        head = has_mtp_head(family, given.raw)
        if head and given.prune_lm_head:
            raise OptionError(
                "prune_lm_head (--prune-lm-head): og.MtpGenerator verifies the MTP head's "
                "drafts with every position's logits; accepted: without it, or a config.json "
                "without mtp_num_hidden_layers (no head)"
            )
        module.hidden_output = head  # the head reads the decoder's hidden states
        weights = given.read_decoder(module, family)  # config vs checkpoint: before the graph
        graphs = {}
        if head:
            graphs[MTP_KEY] = ("decoder", mtp_graph(config, length, family, given.checkpoint))
        graph_model = CausalLMTask().build(module, config)
        attach_weights(graph_model, weights.tensors)
        return KindGraphs(
            graphs={"model": ("decoder", graph_model), **graphs},
            config=config,
            context_length=length,
            family=family,
            prequantized=weights.prequantized,
            float_kinds=weights.float_kinds,
            not_built=None if family.text_only is None else family.text_only.not_built,
        )

    def genai_config(self, package: ModelPackage, written: WrittenGraphs) -> dict[str, Any]:
        return decoder_genai_config(package, written)

    def bundle_files(self, checkpoint: Path, package: ModelPackage) -> dict[str, Any]:
        return {}

    def twin_layers(self, package: ModelPackage) -> tuple[int, int] | None:
        return None


def decoder_genai_config(package: ModelPackage, written: WrittenGraphs) -> dict[str, Any]:
    """genai_config of the package's text decoder, its model.type its row's og type; with an
    MTP head, its `mtp` section (bundle/mtp_config.py)."""
    config = make_genai_config(
        package.config,
        package.ep,
        written.decoder,
        context_length=package.context_length,
        generation=written.generation,
        filename=package.filename(package.decoder_key),
        tool_tokens=tool_token_ids(written.folder),
        genai_type=package.family.genai_type,
        int4_accuracy_level=package.target.int4_plan.accuracy_level,
    )
    if MTP_KEY in package.models:
        head = GraphInfo.from_file(written.folder / package.filename(MTP_KEY))
        with_mtp(config, package.filename(MTP_KEY), head.inputs)
    return config
