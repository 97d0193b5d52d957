"""Feed-forward blocks: the gated MLP of llama-style models and the plain FC MLP."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear
from mobius_genai.components.xielu import XIELU
from mobius_genai.config import ArchitectureConfig

#: Activations with learned parameters: a module the MLP owns as `act_fn` (transformers' name).
LEARNED_ACTIVATIONS: dict[str, type[nn.Module]] = {"xielu": XIELU}


def activation(op, x: ir.Value, name: str) -> ir.Value:
    """The activation a config names, as standard ONNX ops."""
    if name == "silu":
        return op.Mul(x, op.Sigmoid(x))
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        return op.Gelu(x, approximate="tanh")
    if name == "gelu":
        return op.Gelu(x)
    if name == "quick_gelu":  # x · sigmoid(1.702 x) (CLIP's; Qwen2-VL's vision blocks)
        return op.Mul(x, op.Sigmoid(op.Mul(x, op.CastLike(op.Constant(value_float=1.702), x))))
    if name == "relu":
        return op.Relu(x)
    if name == "relu2":  # squared ReLU (nemotron)
        relu = op.Relu(x)
        return op.Mul(relu, relu)
    raise ValueError(f"unsupported activation {name!r}")


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = Linear(hidden, intermediate, bias)
        self.up_proj = Linear(hidden, intermediate, bias)
        self.down_proj = Linear(intermediate, hidden, bias)

    def forward(self, op, x: ir.Value) -> ir.Value:
        gated = op.Mul(activation(op, self.gate_proj(op, x), self.act), self.up_proj(op, x))
        return self.down_proj(op, gated)


class FCMLP(nn.Module):
    """fc2(act(fc1(x))); a learned activation (Apertus's xIELU) is the module `act_fn`."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = True) -> None:
        super().__init__()
        self.act = act
        self.fc1 = Linear(hidden, intermediate, bias)
        self.fc2 = Linear(intermediate, hidden, bias)
        learned = LEARNED_ACTIVATIONS.get(act)
        self.act_fn = learned() if learned is not None else None

    def forward(self, op, x: ir.Value) -> ir.Value:
        hidden = self.fc1(op, x)
        if self.act_fn is not None:
            return self.fc2(op, self.act_fn(op, hidden))
        return self.fc2(op, activation(op, hidden, self.act))


def make_mlp(config: ArchitectureConfig) -> GatedMLP | FCMLP:
    """The feed-forward block of `config`: gated (llama-style) or plain FC (phi, gpt2)."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    if config.gated_mlp:
        return GatedMLP(hidden, intermediate, config.hidden_act, config.mlp_bias)
    return FCMLP(hidden, intermediate, config.hidden_act, config.mlp_bias)
