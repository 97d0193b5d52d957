"""Tier-1 ops of recurrent layers: each standard body computes what onnxruntime's kernel and
numpy compute, on onnxruntime and on onnx's reference evaluator (portable means portable)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator
from onnx_ir.passes.common import InlinePass

from mobius_genai.components.tier1 import MS_DOMAIN, register_functions
from tests.optimize._graphs import clone, parse, random_feeds, run

TOLERANCE = 1e-5  # f32
HEADER = '<ir_version: 10, opset_import: ["" : 24, "com.microsoft" : 1]>'


def _conv_call(length: int, kernel: int, activation: str) -> ir.Model:
    model = parse(
        f"""agraph (float[2,6,{length}] x, float[6,1,{kernel}] w, float[2,6,{kernel - 1}] past)
                => (float[2,6,{length}] y, float[2,6,{kernel - 1}] present) {{
            y, present = com.microsoft.CausalConvWithState<activation="{activation}">(
                x, w, , past)
        }}""",
        header=HEADER,
    )
    if activation != "none":
        next(iter(model.graph)).overload = activation
    return model


def _conv_numpy(feeds: dict[str, np.ndarray], activation: str) -> tuple[np.ndarray, np.ndarray]:
    x, w, past = feeds["x"], feeds["w"], feeds["past"]
    kernel, length = w.shape[-1], x.shape[-1]
    window = np.concatenate([past, x], axis=-1).astype(np.float64)
    y = np.stack(
        [(window[:, :, t : t + kernel] * w[None, :, 0, :]).sum(-1) for t in range(length)], -1
    )
    if activation == "silu":
        y = y / (1 + np.exp(-y))
    return y, window[:, :, length:]


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize(
    ("length", "kernel"),
    [(9, 3), (1, 3), (1, 4), (2, 4)],  # prefill longer than the kernel; decode; shorter than k - 1
)
def test_causal_conv_body_agrees_with_kernel_numpy_and_reference_evaluator(
    activation, length, kernel
):
    model = _conv_call(length, kernel, activation)
    overload = "" if activation == "none" else activation
    assert register_functions(model) == [(MS_DOMAIN, "CausalConvWithState", overload)]
    feeds = random_feeds(model)
    expected = _conv_numpy(feeds, activation)
    kernel_out = run(model, feeds)  # onnxruntime's kernel (it prefers it to the body)
    expanded = clone(model)
    InlinePass()(expanded)
    assert all(node.domain == "" for node in expanded.graph)
    proto = ir.to_proto(expanded)
    onnx.checker.check_model(proto, full_check=True)
    body_out = run(expanded, feeds)
    reference_out = ReferenceEvaluator(ir.to_proto(model)).run(None, feeds)
    for got in (kernel_out, body_out, reference_out):
        for value, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(value, want, atol=TOLERANCE, rtol=0)


def test_causal_conv_with_a_bias_gets_no_body():
    model = parse(
        """agraph (float[2,6,5] x, float[6,1,3] w, float[6] b, float[2,6,2] past)
                => (float[2,6,5] y, float[2,6,2] present) {
            y, present = com.microsoft.CausalConvWithState(x, w, b, past)
        }""",
        header=HEADER,
    )
    assert register_functions(model) == []


def test_capability_field_decides_where_the_conv_body_is_inlined():
    """cpu keeps the fused op; onnx-standard, and an EP whose capabilities say it has no
    kernel, get the body (only standard ops remain)."""
    import dataclasses

    from mobius_genai.ep import get_ep
    from mobius_genai.optimize import optimize_model

    no_kernel = dataclasses.replace(
        get_ep("default").with_kernels({"CausalConvWithState": False}), name="no-conv"
    )
    for caps, fused in (
        (get_ep("cpu"), True),
        (get_ep("onnx-standard"), False),
        (no_kernel, False),
    ):
        model = _conv_call(5, 3, "none")
        register_functions(model)
        optimize_model(model, caps)
        ops = {(node.domain, node.op_type) for node in model.graph}
        assert ((MS_DOMAIN, "CausalConvWithState") in ops) == fused, caps.name
        if not fused:
            assert {domain for domain, _ in ops} == {""}


def _linear_attention_call(
    length: int, q_heads: int, kv_heads: int, attributes: str = ""
) -> ir.Model:
    """q and k with `q_heads` heads of 8, v and the state with `kv_heads` heads of 4 (og's
    Qwen3.5 layout: key heads repeat-interleaved onto more value heads), a per-head decay."""
    q, v = q_heads * 8, kv_heads * 4
    model = parse(
        f"""agraph (float[2,{length},{q}] q, float[2,{length},{q}] k, float[2,{length},{v}] v,
                    float[2,{kv_heads},8,4] past, float[2,{length},{kv_heads}] g,
                    float[2,{length},{kv_heads}] beta)
                => (float[2,{length},{v}] y, float[2,{kv_heads},8,4] present) {{
            y, present = com.microsoft.LinearAttention<q_num_heads={q_heads},
                kv_num_heads={kv_heads}{attributes}>(q, k, v, past, g, beta)
        }}""",
        header=HEADER,
    )
    return model


def _per_head_float64(
    feeds: dict[str, np.ndarray], q_heads: int, kv_heads: int
) -> tuple[np.ndarray, ...]:
    """q, k [b, t, kv_heads, d] (q/k heads repeat-interleaved onto the value heads), v
    [b, t, kv_heads, dv], the past state and a zero output, in float64."""
    q, k, v = (feeds[name].astype(np.float64) for name in ("q", "k", "v"))
    batch, length, _ = q.shape
    q = np.repeat(q.reshape(batch, length, q_heads, -1), kv_heads // q_heads, axis=2)
    k = np.repeat(k.reshape(batch, length, q_heads, -1), kv_heads // q_heads, axis=2)
    v = v.reshape(batch, length, kv_heads, -1)
    return q, k, v, feeds["past"].astype(np.float64), np.zeros_like(v)


def _gated_delta_numpy(
    feeds: dict[str, np.ndarray], q_heads: int, kv_heads: int, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """transformers' torch_recurrent_gated_delta_rule in float64, token by token."""
    q, k, v, state, out = _per_head_float64(feeds, q_heads, kv_heads)
    batch, length = q.shape[:2]
    for t in range(length):
        state = state * np.exp(feeds["g"][:, t])[..., None, None]
        memory = (state * k[:, t, :, :, None]).sum(-2)
        delta = (v[:, t] - memory) * feeds["beta"][:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = (state * q[:, t, :, :, None]).sum(-2) * scale
    return out.reshape(batch, length, -1), state


def _assert_kernel_body_and_reference_give(
    model: ir.Model, feeds: dict[str, np.ndarray], expected: tuple[np.ndarray, ...]
) -> None:
    """onnxruntime's kernel, the body inlined (standard ops only) and onnx's reference
    evaluator each give `expected`."""
    kernel_out = run(model, feeds)
    expanded = clone(model)
    InlinePass()(expanded)
    assert all(node.domain == "" for node in expanded.graph)
    onnx.checker.check_model(ir.to_proto(expanded), full_check=True)
    body_out = run(expanded, feeds)
    reference_out = ReferenceEvaluator(ir.to_proto(model)).run(None, feeds)
    for got in (kernel_out, body_out, reference_out):
        for value, want in zip(got, expected, strict=True):
            np.testing.assert_allclose(value, want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    ("length", "q_heads", "kv_heads", "scale"),
    [(70, 2, 2, 0.5), (1, 2, 4, 0.5), (3, 2, 4, 0.0)],  # prefill past 64; decode; default scale
)
def test_linear_attention_body_agrees_with_kernel_numpy_and_reference_evaluator(
    length, q_heads, kv_heads, scale
):
    model = _linear_attention_call(
        length, q_heads, kv_heads, f', scale={scale}, update_rule="gated_delta"'
    )
    assert register_functions(model) == [(MS_DOMAIN, "LinearAttention", "")]
    feeds = random_feeds(model)
    for name in ("q", "k"):  # L2-normalized heads, as the models feed them
        heads = feeds[name].reshape(2, length, q_heads, 8)
        feeds[name] = (heads / np.linalg.norm(heads, axis=-1, keepdims=True)).reshape(
            feeds[name].shape
        )
    feeds["g"] = -np.abs(feeds["g"])  # log decay: -exp(A_log) * softplus(...) <= 0
    feeds["beta"] = 1 / (1 + np.exp(-feeds["beta"]))
    expected = _gated_delta_numpy(feeds, q_heads, kv_heads, scale or 8**-0.5)
    _assert_kernel_body_and_reference_give(model, feeds, expected)


@pytest.mark.parametrize(
    "attributes",
    [', update_rule="delta"', ", state_window=2"],
)
def test_linear_attention_forms_the_body_does_not_compute_get_no_body(attributes):
    assert register_functions(_linear_attention_call(3, 2, 2, attributes)) == []
    assert register_functions(_linear_attention_call(3, 4, 2)) == []  # more query heads


def test_capability_field_decides_where_the_linear_attention_body_is_inlined():
    import dataclasses

    from mobius_genai.ep import get_ep
    from mobius_genai.optimize import optimize_model

    no_kernel = dataclasses.replace(
        get_ep("default").with_kernels({"LinearAttention": False}), name="no-la"
    )
    for caps, fused in (
        (get_ep("cpu"), True),
        (get_ep("onnx-standard"), False),
        (no_kernel, False),
    ):
        model = _linear_attention_call(4, 2, 2)
        register_functions(model)
        optimize_model(model, caps)
        ops = {(node.domain, node.op_type) for node in model.graph}
        assert ((MS_DOMAIN, "LinearAttention") in ops) == fused, caps.name
        assert (("", "Scan") in ops) == (not fused)


def _gated_call(
    length: int, q_heads: int, kv_heads: int, overload: str = "gated", decays: int = 1
) -> ir.Model:
    """Mamba2's scan as its mixer calls LinearAttention: C and B with `q_heads` groups of 8,
    dt * x and the state with `kv_heads` heads of 4, a per-head decay, no beta; `decays` 8:
    a decay per key dim (Mamba1's, its A per state entry)."""
    q, v, g = q_heads * 8, kv_heads * 4, kv_heads * decays
    model = parse(
        f"""agraph (float[2,{length},{q}] q, float[2,{length},{q}] k, float[2,{length},{v}] v,
                    float[2,{kv_heads},8,4] past, float[2,{length},{g}] g)
                => (float[2,{length},{v}] y, float[2,{kv_heads},8,4] present) {{
            y, present = com.microsoft.LinearAttention<q_num_heads={q_heads},
                kv_num_heads={kv_heads}, update_rule="gated", scale=1.0>(q, k, v, past, g)
        }}""",
        header=HEADER,
    )
    node = next(iter(model.graph))
    node.overload = overload
    node.resize_inputs(6)  # beta left empty, as the mixer leaves it
    return model


def _gated_numpy(
    feeds: dict[str, np.ndarray], q_heads: int, kv_heads: int
) -> tuple[np.ndarray, np.ndarray]:
    """transformers' mamba2_selective_state_update in float64, token by token: each head reads
    the B (k) and C (q) of its group, the groups repeat-interleaved onto the heads; the decay
    per head, or per head and key dim."""
    q, k, v, state, out = _per_head_float64(feeds, q_heads, kv_heads)
    batch, length = q.shape[:2]
    for t in range(length):
        decay = np.exp(feeds["g"][:, t].reshape(batch, kv_heads, -1))[..., None]
        state = state * decay + k[:, t, :, :, None] * v[:, t, :, None, :]
        out[:, t] = (state * q[:, t, :, :, None]).sum(-2)
    return out.reshape(batch, length, -1), state


@pytest.mark.parametrize(
    ("length", "q_heads", "kv_heads", "decays"),
    # prefill; decode; one group; a group a head; Mamba1's decay per key dim, prefill and decode
    [(70, 2, 4, 1), (1, 2, 4, 1), (3, 1, 2, 1), (5, 2, 2, 1), (70, 1, 3, 8), (1, 1, 3, 8)],
)
def test_gated_linear_attention_body_agrees_with_kernel_numpy_and_reference_evaluator(
    length, q_heads, kv_heads, decays
):
    model = _gated_call(length, q_heads, kv_heads, decays=decays)
    assert register_functions(model) == [(MS_DOMAIN, "LinearAttention", "gated")]
    feeds = random_feeds(model)
    feeds["g"] = -np.abs(feeds["g"])  # dt * A <= 0
    expected = _gated_numpy(feeds, q_heads, kv_heads)
    _assert_kernel_body_and_reference_give(model, feeds, expected)


def test_linear_attention_bodies_follow_the_update_rule_and_beta():
    """The gated body is only for update_rule "gated" without beta, the delta body only for
    "gated_delta" with it."""
    assert register_functions(_gated_call(3, 2, 4, overload="")) == []
    with_beta = _linear_attention_call(3, 2, 2, ', update_rule="gated"')
    next(iter(with_beta.graph)).overload = "gated"
    assert register_functions(with_beta) == []


def test_kernel_table_decides_where_the_gated_body_is_inlined():
    """The gated rule is a kernel of its own ("LinearAttention.gated"): kept where onnxruntime's
    kernel was measured (cpu, and default's onnxruntime), inlined elsewhere (cuda), while the
    gated delta rule stays LinearAttention there."""
    from mobius_genai.ep import get_ep
    from mobius_genai.optimize import optimize_model

    cpu = get_ep("cpu")
    for caps, fused in (
        (cpu, True),
        (get_ep("default"), True),
        (get_ep("cuda"), False),
        (cpu.with_kernels({"LinearAttention.gated": False}), False),
    ):
        model = _gated_call(4, 2, 4)
        register_functions(model)
        optimize_model(model, caps)
        ops = {(node.domain, node.op_type) for node in model.graph}
        assert ((MS_DOMAIN, "LinearAttention") in ops) == fused, caps.name
        assert (("", "Scan") in ops) == (not fused)
    delta = _linear_attention_call(4, 2, 2)
    register_functions(delta)
    optimize_model(delta, get_ep("cuda"))
    assert (MS_DOMAIN, "LinearAttention") in {(node.domain, node.op_type) for node in delta.graph}
