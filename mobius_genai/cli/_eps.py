"""`mobius-genai eps`: the registered execution providers and their capabilities, as a table;
with ``--kernels``, every kernel of ep/kernels.py's table and the dtypes each EP runs it in;
with ``--families``, every model_type of the decoder family table."""

from __future__ import annotations

import argparse
import textwrap
from typing import TYPE_CHECKING

import onnx_ir as ir

from mobius_genai.cli._table import aligned_table
from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.config.recurrent import RECURRENT_BLOCKS
from mobius_genai.ep import EpCapabilities, EpRegistry, ep_registry
from mobius_genai.ep.kernels import KERNELS, missing
from mobius_genai.quantize.plan import Int4Plan, int4_plan
from mobius_genai.target import precision_of

if TYPE_CHECKING:
    from mobius_genai.models.families.adapter import FamilyAdapter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`eps [--wide | --kernels]`."""
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "--wide",
        action="store_true",
        help="every column (fusions, provider options, onnxruntime EP names); the default "
        "table fits 100 columns",
    )
    shown.add_argument(
        "--families",
        action="store_true",
        help="every decoder model_type: onnxruntime-genai's model.type for it, and its blocks "
        "beyond attention and an MLP",
    )
    shown.add_argument(
        "--kernels",
        action="store_true",
        help="every kernel an EP may lack, the dtypes each EP runs it in, and what an EP "
        "without it gets",
    )


def run(args: argparse.Namespace) -> int:
    """Print the registry table (or the kernel table) on stdout."""
    if args.families:
        print(format_family_table())
    else:
        print(format_kernel_table() if args.kernels else format_ep_table(wide=args.wide))
    return 0


_TABLE_HEADERS = (
    "name",
    "dtypes",
    "GQA dtypes",
    "fused rope",
    "skip-norm",
    "fused matmul",
    "fused MoE",
    "packed MHA",
    "custom ops",
    "int4",
    "provider options",
    "graph capture",
    "onnxruntime EP",
)


#: The default table's width, and its columns: what a user choosing an EP and a precision
#: reads first.
_WIDTH = 100
_NARROW_HEADERS = ("name", "dtypes", "GQA dtypes", "custom ops", "int4", "graph capture")

_ALSO_ACCEPTED = "Names are accepted in any case, and an EP's onnxruntime EP name stands for it."
_WIDER = "`mobius-genai eps --wide` adds: "
_KERNELS = "`mobius-genai eps --kernels`: every kernel, and the dtypes each EP runs it in."
_FAMILIES = "`mobius-genai eps --families`: every decoder model_type this package builds."
_OTHER_KINDS = "Vision-language and speech model types: README.md, Supported architectures."
_CELLS = "all: every model dtype the EP runs (`mobius-genai eps`, dtypes column); -: none."


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _dtypes(dtypes: frozenset[ir.DataType]) -> str:
    return ", ".join(precision_of(d) for d in sorted(dtypes, key=lambda d: d.value)) or "-"


def _moe(caps: EpCapabilities, plan: Int4Plan) -> str:
    """Whether MoE layers keep onnxruntime's fused op, and their int4 experts its QMoE."""
    if not (caps.supports_fused_moe and caps.supports_custom_ops):
        return "no"
    return "yes (int4: QMoE)" if plan.qmoe else "yes"


def _packed_attention(caps: EpCapabilities) -> str:
    """Whether vision towers keep com.microsoft::PackedMultiHeadAttention, and for which dtypes."""
    dtypes = _kernel_dtypes(caps, "PackedMultiHeadAttention")
    return f"yes ({_dtypes(dtypes)})" if dtypes else "no"


def _kernel_dtypes(caps: EpCapabilities, name: str) -> frozenset[ir.DataType]:
    """The dtypes `caps` runs kernel `name` in, within the op schema's (none if it lacks it)."""
    if missing(caps, name) is not None:
        return frozenset()
    schema = TIER1_OPS[name].dtypes if name in TIER1_OPS else None
    return caps.kernel_dtypes(name) & (caps.model_dtypes if schema is None else schema)


def _kernel_cell(caps: EpCapabilities, name: str) -> str:
    dtypes = _kernel_dtypes(caps, name)
    return "all" if dtypes == caps.model_dtypes else _dtypes(dtypes)


def format_kernel_table(registry: EpRegistry | None = None) -> str:
    """Every row of the kernel table (ep/kernels.py) against every registered EP: the model
    dtypes it runs the kernel in, and what an EP without it gets."""
    registry = ep_registry if registry is None else registry
    entries = registry.entries()
    header = ("kernel", *(caps.name for caps in entries), "without it")
    rows = [
        (name, *(_kernel_cell(caps, name) for caps in entries), kernel.without)
        for name, kernel in KERNELS.items()
    ]
    return "\n".join([aligned_table([header, *rows]), "", _CELLS])


def _table_row(caps: EpCapabilities) -> tuple[str, ...]:
    options = ", ".join(f"{key}={value}" for key, value in caps.provider_options.items())
    plan = int4_plan(caps, caps.default_dtype)
    return (
        caps.name,
        _dtypes(caps.model_dtypes),
        _dtypes(caps.gqa_dtypes),
        _yes_no(caps.supports_fused_rope),
        _yes_no(caps.supports_skip_layer_norm),
        _yes_no(caps.supports_fused_matmul),
        _moe(caps, plan),
        _packed_attention(caps),
        _yes_no(caps.supports_custom_ops),
        f"{plan.matmul}, level {plan.accuracy_level}" if plan.matmul_nbits else plan.matmul,
        options or "-",
        "on" if caps.enable_graph_capture else ("off" if caps.graph_capture_option else "-"),
        caps.runtime.ort_provider or "-",
    )


def format_ep_table(registry: EpRegistry | None = None, *, wide: bool = False) -> str:
    """The registry as an aligned text table (for `mobius-genai eps`): the columns that fit
    100 characters, or with `wide` every column; then the other names accepted: aliases, any
    case, onnxruntime names."""
    registry = ep_registry if registry is None else registry
    rows = [_TABLE_HEADERS, *(_table_row(caps) for caps in registry.entries())]
    if not wide:
        kept = [_TABLE_HEADERS.index(header) for header in _NARROW_HEADERS]
        rows = [tuple(row[i] for i in kept) for row in rows]
    lines = [aligned_table(rows), ""]
    if registry.aliases:
        aliases = ", ".join(
            f"{alias} -> {target}" for alias, target in sorted(registry.aliases.items())
        )
        lines.append(f"aliases: {aliases}")
    lines.append(_ALSO_ACCEPTED)
    if not wide:
        more = ", ".join(h for h in _TABLE_HEADERS if h not in _NARROW_HEADERS)
        lines.append(textwrap.fill(f"{_WIDER}{more}.", _WIDTH))
        lines.append(_KERNELS)
        lines.append(_FAMILIES)
    return "\n".join(lines)


def _blocks(row: FamilyAdapter) -> str:
    """What a family row builds beyond attention and an MLP, read from its data: the recurrent
    blocks whose settings it reads, latent attention (with sparse attention's indexer where the
    row defaults index_topk), differential attention, ALiBi, BitNet's
    projections, MoE, a multimodal checkpoint's decoder."""
    overrides = row.config_overrides
    blocks = [b.layer_type for b in RECURRENT_BLOCKS.values() if b.section in overrides]
    if "shared_blocks" in overrides:
        blocks = [f"{block} after shared transformer blocks" for block in blocks]
    elif overrides.get("parallel_recurrent"):
        blocks = [f"{block} beside attention" for block in blocks]
    if overrides.get("one_block_layers"):
        blocks.append("one block per layer")
    if "latent_attention" in overrides:
        indexed = "index_topk" in row.config_defaults  # DeepSeek sparse attention's indexer
        blocks.append("latent attention" + (" with a top-k indexer" if indexed else ""))
    if "alibi" in overrides:
        blocks.append("ALiBi")
    if "differential_attention" in overrides:
        blocks.append("differential attention")
    if "attention_experts" in overrides:
        blocks.append("mixture of attention heads")
    if "dynamic_mask" in overrides:
        blocks.append("dynamic mask attention")
    if "bitlinear" in overrides:
        blocks.append("BitLinear (sub-norms, int8 activations)")
    if row.experts is not None or "moe" in overrides:
        blocks.append("MoE")
    if row.text_only is not None:
        blocks.append("text decoder only")
    return ", ".join(blocks) or "-"


def format_family_table() -> str:
    """The decoder family table (models/families/) as an aligned text table: each model_type,
    the onnxruntime-genai model.type of its bundle, its blocks beyond attention and an MLP."""
    from mobius_genai.models import FAMILIES

    rows = [("model_type", "onnxruntime-genai type", "blocks beyond attention + MLP")]
    rows += [(name, row.genai_type, _blocks(row)) for name, row in sorted(FAMILIES.items())]
    return "\n".join([aligned_table(rows), "", _OTHER_KINDS])
