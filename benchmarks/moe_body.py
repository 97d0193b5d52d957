"""The MoE fallback body before and after it gathered only the picked experts (CPU, one layer);
with --int4, the float body against the 4-bit GeGLU bodies of an int4 bundle.

One com.microsoft::MoE node in Gemma-4-26B-A4B's expert shapes (hidden 2816, 128 GeGLU experts
of intermediate 704, 8 per token; random fp32 weights as initializers, ~3 GB), its body registered
and inlined as Stage 2b does for an EP without the kernel (every EP, for GeGLU). "old" is the
body of mobius_genai/components/tier1.py at commit OLD_COMMIT (every expert on every token,
the unpicked ones weighted by exact zeros), "new" the installed one. With --int4 the bodies are
"new" and the installed QMoE GeGLU bodies int4 writes (quantize/qmoe.py: the same weights in
4 bits, blocks of 32 with zero points, the default recipe's layout, round-to-nearest): "int4"
dequantizes the picked experts with GatherBlockQuantized (cpu, cuda, webgpu), k (8) at a time
in a Loop over groups of picked experts, "int4-standard" with standard ops (the other EPs), and
"int4-all" is the GatherBlockQuantized body of commit INT4_ALL_COMMIT, which dequantized every
picked expert at once; "int4-experts" is the cpu EP's body (QMoEPass with `per_expert`, the EP's
"MatMulNBits.experts" row: two MatMulNBits per expert, each on its own constant codes, on the
rows that picked it, split off the rows sorted by expert). Each body runs
in its own `python -I` process (one onnxruntime thread), one after the other, loading the model
written under benchmarks/_work/moe_body/: session load, then `--rounds` rounds of a
`--prompt`-token prefill and `--steps` one-token decode steps (random routing each), timed by
the calling thread's CPU time; the process reports its peak RSS after the load and at the end,
and its output on one 4-token input, which the parent compares across bodies. `--profile` adds
onnxruntime's kernel time per op type of a decode step (wall time, in a session of its own).

    python benchmarks/moe_body.py [--int4] [--profile] [--experts 128] [--prompt 64] [--steps 8]
                                  [--rounds 3] [--bodies int4-all,int4]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnx_ir.passes.common import InlinePass

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "_work" / "moe_body"
OLD_COMMIT = "4d046a3"  # the last commit whose MoE body ran every expert
INT4_ALL_COMMIT = "394caad"  # the last commit whose QMoE body dequantized every picked expert
HIDDEN, INTER, TOP_K = 2816, 704, 8
INT4_BODIES = ("int4-all", "int4", "int4-standard", "int4-experts")


def _module(commit: str, path: str, name: str):
    """The module at `path` of our own `commit`."""
    source = subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)  # our own history
    return module


def _tier1(body: str):
    """The tier1 module of OLD_COMMIT ("old") or of the installed package (the others)."""
    if body != "old":
        from mobius_genai.components import tier1

        return tier1
    return _module(OLD_COMMIT, "mobius_genai/components/tier1.py", "old_tier1")


def _register_int4_all(tier1, model: ir.Model) -> None:
    """Register INT4_ALL_COMMIT's QMoE GeGLU body in `model` (in place of the installed one)."""
    old = _module(INT4_ALL_COMMIT, "mobius_genai/components/moe_bodies.py", "int4_all_bodies")
    spec = dataclasses.replace(tier1.TIER1_OPS["QMoE"], bodies={"geglu": old.qmoe_geglu})
    for identifier in [key for key in model.functions if key[1] == "QMoE"]:
        model.functions[identifier] = spec.function(identifier[2], model.opset_imports[""])


def _write_model(tier1, experts: int, path: Path, body: str) -> None:
    """The MoE node with `tier1`'s body inlined (an int4 `body`: quantized first), its weights
    in `path`.data."""
    rng = np.random.default_rng(0)
    f32 = ir.DataType.FLOAT
    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([1, "tokens", HIDDEN]))
    router = ir.Value(name="router", type=ir.TensorType(f32), shape=ir.Shape(["tokens", experts]))
    weights = []
    for name, shape in (("fc1", (experts, 2 * INTER, HIDDEN)), ("fc2", (experts, HIDDEN, INTER))):
        array = (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        value = ir.Value(
            name=name, shape=ir.Shape(shape), type=ir.TensorType(f32), const_value=ir.tensor(array)
        )
        weights.append(value)
    node = ir.node(
        "MoE",
        [x, router, weights[0], None, weights[1]],
        {
            "k": TOP_K,
            "activation_type": "geglu",
            "swiglu_fusion": 1,
            "normalize_routing_weights": 1,
        },
        domain=tier1.MS_DOMAIN,
        overload="geglu",
    )
    node.outputs[0].name = "y"
    node.outputs[0].type = ir.TensorType(f32)
    graph = ir.Graph(
        [x, router],
        node.outputs,
        nodes=[node],
        initializers=weights,
        opset_imports={"": 24, tier1.MS_DOMAIN: 1},
    )
    model = ir.Model(graph, ir_version=10)
    if body in INT4_BODIES:
        from mobius_genai.quantize.qmoe import QMoEPass

        gather, per_expert = body != "int4-standard", body == "int4-experts"
        QMoEPass(32, False, False, 0, kernel=False, gather=gather, per_expert=per_expert)(model)
        tier1.register_functions(model)
        if body == "int4-all":
            _register_int4_all(tier1, model)
        InlinePass(criteria=tier1.expanded_after_int4)(model)
    else:
        tier1.register_functions(model)
        InlinePass()(model)
    ir.save(model, path, external_data=f"{path.name}.data")


def _time(session: ort.InferenceSession, tokens: int, experts: int, runs: int) -> float:
    """Seconds of CPU per run of `tokens` tokens (random routing per run)."""
    rng = np.random.default_rng(tokens)
    feeds = [
        {
            "x": rng.standard_normal((1, tokens, HIDDEN), dtype=np.float32),
            "router": rng.standard_normal((tokens, experts), dtype=np.float32),
        }
        for _ in range(runs)
    ]
    started = time.thread_time()
    for feed in feeds:
        session.run(None, feed)
    return (time.thread_time() - started) / runs


def _path(body: str, experts: int) -> Path:
    return WORK / f"{body}_{experts}.onnx"


def _peak_rss_gb() -> float:
    """This process's peak RSS since it started (VmHWM: ru_maxrss would carry the parent's
    peak, the models' writing, across the fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def child(body: str, experts: int, prompt: int, steps: int, rounds: int, profile: bool) -> None:
    """The session of one body's model in this process: its timings, and its peak RSS after
    loading and at the end, as a JSON line."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    started = time.perf_counter()
    session = ort.InferenceSession(
        str(_path(body, experts)), options, providers=["CPUExecutionProvider"]
    )
    load_s = time.perf_counter() - started
    result = {"prefill": [], "decode": [], "load_peak_rss_gb": _peak_rss_gb(), "load_s": load_s}
    _time(session, 1, experts, 1)  # warm-up
    for _ in range(rounds):
        result["prefill"].append(_time(session, prompt, experts, 1))
        result["decode"].append(_time(session, 1, experts, steps))
    result["peak_rss_gb"] = _peak_rss_gb()
    rng = np.random.default_rng(7)
    check = {
        "x": rng.standard_normal((1, 4, HIDDEN), dtype=np.float32),
        "router": rng.standard_normal((4, experts), dtype=np.float32),
    }
    result["check"] = session.run(None, check)[0].reshape(-1).tolist()
    if profile:
        result["decode_kernel_ms"] = _decode_profile(body, experts, steps)
    print(json.dumps(result))


def _decode_profile(body: str, experts: int, steps: int) -> dict[str, float]:
    """Kernel ms per decode step by op type (onnxruntime's profiler, a session of its own;
    wall time, which a loaded machine stretches: compare the ops' shares)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(WORK / f"profile_{body}")
    session = ort.InferenceSession(
        str(_path(body, experts)), options, providers=["CPUExecutionProvider"]
    )
    _time(session, 1, experts, 1)  # warm-up, left out below
    _time(session, 1, experts, steps)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted(e["ts"] for e in events if e["name"] == "model_run")
    kernel_us: dict[str, float] = {}
    for event in events:
        if (
            event.get("cat") == "Node"
            and event["name"].endswith("_kernel_time")
            and event["ts"] >= runs[1]
            and event["args"]["op_name"] not in ("If", "Loop")  # their nodes are counted
        ):
            op = event["args"]["op_name"]
            kernel_us[op] = kernel_us.get(op, 0.0) + event["dur"]
    return {op: us / steps / 1e3 for op, us in kernel_us.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--int4", action="store_true", help="the float body against int4's")
    parser.add_argument("--profile", action="store_true", help="kernel ms of a decode step")
    parser.add_argument("--bodies", help="only these bodies, comma-separated (the first: ratios)")
    parser.add_argument("--child", choices=("old", "new", *INT4_BODIES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.experts, args.prompt, args.steps, args.rounds, args.profile)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    bodies = ("new", *INT4_BODIES) if args.int4 else ("old", "new")
    if args.bodies:
        bodies = tuple(body for body in args.bodies.split(",") if body in bodies)
    for body in bodies:
        _write_model(_tier1(body), args.experts, _path(body, args.experts), body)
    results = {}
    for body in bodies:
        line = subprocess.run(
            [sys.executable, "-I", __file__, "--child", body, *sys.argv[1:]],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        results[body] = json.loads(line.splitlines()[-1])
    first = bodies[0]
    print(f"{'':8}" + "".join(f" {body:>13}" for body in bodies) + f"  (ratio: {first} / body)")
    for phase in ("decode", "prefill"):
        base = statistics.median(results[first][phase])
        cells = []
        for body in bodies:
            value = statistics.median(results[body][phase])
            cells.append(f" {value * 1e3:7.1f}ms {base / value:4.2f}")
        print(f"{phase:8}" + "".join(cells))
    base = results[first]["load_s"]
    print(
        "load    "
        + "".join(
            f" {results[b]['load_s']:8.2f}s {base / results[b]['load_s']:4.2f}" for b in bodies
        )
    )
    for key, label in (("load_peak_rss_gb", "RSS load"), ("peak_rss_gb", "RSS peak")):
        base = results[first][key]
        cells = [f" {results[b][key]:7.2f}GB {base / results[b][key]:4.2f}" for b in bodies]
        print(f"{label:8}" + "".join(cells))
    _print_checks(bodies, results)
    if args.profile:
        _print_profiles(bodies, results)


def _print_checks(bodies: tuple[str, ...], results: dict) -> None:
    """Each body's output on one 4-token input against the "int4" body's (the same 4-bit
    weights) and the float body's: max abs difference over the largest value."""
    for reference in [b for b in ("int4", "new") if b in results]:
        expected = np.asarray(results[reference]["check"])
        scale = np.abs(expected).max()
        cells = [
            f"{b}: {np.abs(np.asarray(results[b]['check']) - expected).max() / scale:.1e}"
            for b in bodies
        ]
        print(f"output vs {reference}: " + ", ".join(cells))


def _print_profiles(bodies: tuple[str, ...], results: dict) -> None:
    """Kernel ms per decode step, by op type, each body a column."""
    profiles = {b: results[b]["decode_kernel_ms"] for b in bodies}
    ops = sorted(
        {op for p in profiles.values() for op in p},
        key=lambda op: -max(p.get(op, 0) for p in profiles.values()),
    )
    print("| kernel ms a decode step | " + " | ".join(bodies) + " |")
    print("|---|" + "--:|" * len(bodies))
    for op in ops:
        cells = [profiles[b].get(op, 0.0) for b in bodies]
        if max(cells) >= 0.05:
            print(f"| {op} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    print(
        "| all kernels | " + " | ".join(f"{sum(p.values()):.2f}" for p in profiles.values()) + " |"
    )


if __name__ == "__main__":
    main()
