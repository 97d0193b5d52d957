"""Speed and memory of a bundle with onnxruntime-genai: `mobius-genai bench` and benchmarks/.

`speed` times one generation (prefill, decode, time to first token); `runner` measures each
configuration in a process of its own, so peak memory figures do not accumulate.
"""
