"""What onnxruntime-genai 0.18's og.Engine feeds a decoder whose KV cache grows by concatenation,
read back through a graph that echoes it: each row's next token is a number computed from that
row's inputs. These are the facts components/kv_slots.py relies on (og_support.py's docstring).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
from onnx import TensorProto, helper

from tests.runtime._og import PROMPTS, engine_tokens

NEW = (6, 4, 2)  # the longest prompt finishes first: the mask stops growing while others run
ROWS = list(zip(PROMPTS, NEW, strict=True))

#: Echoed number → the nodes computing it per row as "code" ([batch] int64).
ECHOES = {
    "mask_length": [helper.make_node("Expand", ["length", "batch"], ["code"])],
    "mask_ones": [helper.make_node("ReduceSum", ["attention_mask", "one"], ["code"], keepdims=0)],
    "past_length": [
        helper.make_node("Shape", ["past_key_values.0.key"], ["past"], start=2, end=3),
        helper.make_node("Expand", ["past", "batch"], ["code"]),
    ],
    "first_position": [helper.make_node("Gather", ["position_ids", "zero"], ["code"], axis=1)],
}


def _echo_graph(config: dict, echo: str) -> onnx.ModelProto:
    """A decoder with the bundle's inputs and outputs: its logits pick token `code` in every
    position of a row; its presents are zeros as long as the mask, the length og binds."""
    decoder = config["model"]["decoder"]
    vocab, heads = config["model"]["vocab_size"], decoder["num_key_value_heads"]
    size, layers = decoder["head_size"], decoder["num_hidden_layers"]
    int64, f32 = TensorProto.INT64, TensorProto.FLOAT
    dims = ["batch_size", "sequence_length"]
    inputs = [
        helper.make_tensor_value_info("input_ids", int64, dims),
        helper.make_tensor_value_info("attention_mask", int64, ["batch_size", "total"]),
        helper.make_tensor_value_info("position_ids", int64, dims),
    ]
    outputs = [helper.make_tensor_value_info("logits", f32, [*dims, vocab])]
    constants = {
        "zero": np.array(0, np.int64),
        "one": np.array([1], np.int64),
        "heads": np.array([heads], np.int64),
        "size": np.array([size], np.int64),
        "vocab_size": np.array([vocab], np.int64),
        "vocab": np.arange(vocab, dtype=np.float32),
        "zeros": np.zeros(1, np.float32),
    }
    nodes = [
        helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(array))
        for name, array in constants.items()
    ]
    nodes += [
        helper.make_node("Shape", ["input_ids"], ["batch"], start=0, end=1),
        helper.make_node("Shape", ["input_ids"], ["seq"], start=1, end=2),
        helper.make_node("Shape", ["attention_mask"], ["length"], start=1, end=2),
        *ECHOES[echo],
        helper.make_node("Cast", ["code"], ["float_code"], to=f32),
        helper.make_node("Unsqueeze", ["float_code", "one"], ["column"]),
        helper.make_node("Sub", ["vocab", "column"], ["distance"]),
        helper.make_node("Abs", ["distance"], ["far"]),
        helper.make_node("Neg", ["far"], ["row"]),
        helper.make_node("Unsqueeze", ["row", "one"], ["rows"]),
        helper.make_node("Concat", ["batch", "seq", "vocab_size"], ["logits_shape"], axis=0),
        helper.make_node("Expand", ["rows", "logits_shape"], ["logits"]),
        helper.make_node("Concat", ["batch", "heads", "length", "size"], ["kv_shape"], axis=0),
    ]
    kv = ["batch_size", heads, "past_sequence_length", size]
    for layer in range(layers):
        for part in ("key", "value"):
            past, present = f"past_key_values.{layer}.{part}", f"present.{layer}.{part}"
            inputs.append(helper.make_tensor_value_info(past, f32, kv))
            outputs.append(helper.make_tensor_value_info(present, f32, [*kv[:2], "total", size]))
            nodes.append(helper.make_node("Expand", ["zeros", "kv_shape"], [present]))
    graph = helper.make_graph(nodes, "echo", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.fixture(scope="module")
def echoed(default_ep, tmp_path_factory) -> dict[str, list[list[int]]]:
    """Echo name → the numbers og.Engine's rows read, one per step, for PROMPTS and NEW."""
    config = json.loads((default_ep.bundle / "genai_config.json").read_text())
    assert config["search"]["past_present_share_buffer"] is False
    found = {}
    for echo in ECHOES:
        folder = tmp_path_factory.mktemp("echo") / echo
        shutil.copytree(default_ep.bundle, folder, ignore=shutil.ignore_patterns("model.onnx*"))
        onnx.save(_echo_graph(config, echo), folder / "model.onnx")
        tokens, failures = engine_tokens(og.Model(str(folder)), PROMPTS, NEW)
        assert failures == []
        found[echo] = tokens
    return found


def test_each_row_is_masked_as_its_own_contiguous_length(echoed):
    """Row i at step k (its prompt and k tokens fed) has ones over exactly that length, from a
    mask as long as the longest row's (a finished row's counts its last token), and continues
    from position len + k - 1."""
    lengths = [[len(prompt) + k for k in range(new)] for prompt, new in ROWS]
    assert echoed["mask_ones"] == lengths
    assert echoed["first_position"] == [[0] + [n - 1 for n in row[1:]] for row in lengths]
    longest = [max(len(prompt) + min(k, new) for prompt, new in ROWS) for k in range(6)]
    assert echoed["mask_length"] == [longest[:new] for new in NEW]


def test_the_past_is_the_previous_steps_mask_long(echoed):
    """Past and present are as long as the previous and the current mask: after the longest
    row has finished, the past is as long as the mask (a concatenation would overrun it)."""
    lengths = echoed["mask_length"][0]
    assert echoed["past_length"][0] == [0, *lengths[:-1]]
    assert lengths[3] == lengths[2] == len(PROMPTS[2]) + NEW[2]  # the longest has finished
