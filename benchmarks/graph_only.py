"""Graph-only build (load_weights=False) time and peak RSS for real-size configs.

Each build runs in its own process so peak RSS is that build's alone. The reference, measured in
the same run, is a bare process that imports mobius_genai and does nothing: figures are also given
as ratios against it (build time minus import, RSS over the import's).

    python benchmarks/graph_only.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {
    "Qwen2.5-7B": {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
    "Llama-3-70B": {
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
    },
}

_CHILD = """
import resource, sys, time
started = time.perf_counter()
import mobius_genai
imported = time.perf_counter()
if sys.argv[1] != "-":
    mobius_genai.build(sys.argv[1], sys.argv[2], load_weights=False)
done = time.perf_counter()
print(imported - started, done - imported, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _measure(folder: str, ep: str) -> tuple[float, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, folder, ep], capture_output=True, text=True, check=True
    )
    import_s, build_s, rss_kb = out.stdout.split()
    return float(import_s), float(build_s), int(rss_kb) / 1024


def main() -> None:
    baseline_import, _, baseline_rss = _measure("-", "default")
    print(
        f"reference: bare `import mobius_genai`: {baseline_import:.2f} s, {baseline_rss:.0f} MiB peak RSS"
    )
    print(f"{'config':<14} {'ep':<8} {'build s':>8} {'peak MiB':>9} {'RSS / ref':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in CONFIGS.items():
            folder = Path(tmp) / name
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(config))
            for ep in ("default", "cuda"):
                _, build_s, rss = _measure(str(folder), ep)
                print(f"{name:<14} {ep:<8} {build_s:>8.2f} {rss:>9.0f} {rss / baseline_rss:>9.2f}")


if __name__ == "__main__":
    main()
