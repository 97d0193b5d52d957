"""DeepStack (Qwen3-VL): vision features added to the text decoder's first hidden states.

transformers adds the k-th DeepStack feature of each image token to the hidden states after
decoder layer k (k < the tower's DeepStack layers). onnxruntime-genai 0.18 feeds a decoder
only `inputs_embeds` [batch, seq, decoder.hidden_size], so the embedding graph writes the
features beside each token's embedding: inputs_embeds [batch, seq, hidden · (1 + layers)], the
token's embedding first, then its DeepStack parts (zeros for text tokens, so adding them
elsewhere changes nothing), and genai_config's decoder.hidden_size says that width.
"""

from __future__ import annotations

import onnx_ir as ir


def split_deepstack(op, embeds: ir.Value, layers: int) -> tuple[ir.Value, list[ir.Value]]:
    """inputs_embeds → (the token embeddings, the `layers` DeepStack parts, in layer order)."""
    if not layers:
        return embeds, []
    first, *rest = op.Split(embeds, axis=-1, num_outputs=1 + layers, _outputs=1 + layers)
    return first, rest


def widen_embeddings(op, embeds: ir.Value, hidden: int, layers: int) -> ir.Value:
    """Token embeddings [batch, seq, hidden] with zero DeepStack parts after them."""
    if not layers:
        return embeds
    pads = op.Constant(value_ints=[0, 0, 0, 0, 0, hidden * layers])
    return op.Pad(embeds, pads)
