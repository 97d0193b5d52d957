"""A vision-language checkpoint is read by the same readers as a text decoder's: GPTQ integers
(here) reach its decoder graph as stored, and a build reads the float weights the format's
dequantization gives (`tests/_prequantized.py` writes both checkpoints from the format)."""

from __future__ import annotations

import numpy as np

from mobius_genai.build import build
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.checkpoint.prequantized import PrequantizedTensor
from tests._prequantized import Format, write_quantized_pair
from tests._vlm import write_tiny_gemma3


def test_a_gptq_vision_language_checkpoint_keeps_its_integers(tmp_path):
    floats = write_tiny_gemma3(tmp_path / "float")
    integers = write_quantized_pair(
        floats, tmp_path / "gptq", tmp_path / "reference", Format("gptq")
    )
    assert any(name.startswith("language_model.") for name in integers)
    assert stored_bits(tmp_path / "gptq") == frozenset({4})
    package = build(tmp_path / "gptq", "cpu", "fp32", progress=False)
    reference = build(tmp_path / "reference", "cpu", "fp32", progress=False)
    assert package.prequantized == "GPTQ 4-bit, group size 32, asymmetric, format gptq"
    assert reference.prequantized is None
    stored = {
        key: [
            part
            for value in package[key].graph.initializers.values()
            for part in getattr(value.const_value, "parts", [value.const_value])
            if isinstance(part, PrequantizedTensor)
        ]
        for key in ("vision", "embedding", "decoder")
    }
    # every Linear of the 3 decoder layers (q, k and v packed into one for cpu's GQA)
    assert len(stored["decoder"]) == 3 * 7
    assert len(stored["vision"]) == 2 * 3  # the q, k and v of the 2 SigLIP layers
    assert list(package.float_kinds) == ["F32"]  # the rest, read as float
    for key in ("vision", "embedding", "decoder"):
        ours = package[key].graph.initializers
        for name, value in reference[key].graph.initializers.items():
            if value.const_value is not None:
                np.testing.assert_allclose(
                    ours[name].const_value.numpy(), value.const_value.numpy(), rtol=0, atol=1e-6
                )
