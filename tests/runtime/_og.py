"""Test-only drivers of onnxruntime-genai 0.18's public API (og.Engine, og.Generator) that the
contract tests share: each returns plain token lists so tests compare paths with one another."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime_genai as og

TOKEN = int(og.EngineEventFlags.TOKEN)
#: Prompts of different lengths (tiny-qwen2 ids; bos 381 first): Engine batches them together.
PROMPTS = (
    [381, 17, 92, 250, 33, 301, 8, 140],
    [381, 17, 92],
    [381, 17, 92, 250, 33, 301, 8, 140, 5, 6, 7, 8, 9],
)
MAX_STEPS = 1000


def engine_tokens(
    model: og.Model, prompts: Sequence[Sequence[int]], new_tokens: int | Sequence[int]
) -> tuple[list[list[int]], list[str]]:
    """Greedy tokens of every prompt (`new_tokens` each, or per prompt), all requests begun
    before the first engine.run(), and the finish reasons of turns that failed (og.Engine's
    public API only)."""
    engine = og.Engine(model)
    requests = []
    if isinstance(new_tokens, int):
        new_tokens = [new_tokens] * len(prompts)
    for prompt, new in zip(prompts, new_tokens, strict=True):
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_do_sample(False)
        options.set_max_generated_tokens(new)
        request.begin_turn(np.asarray(prompt, dtype=np.int32), options)
        requests.append((request, []))
    buffer = engine.create_event_buffer(16)
    failures = []
    for _ in range(MAX_STEPS):
        if not engine.has_pending_requests():
            break
        for event in engine.run(buffer):
            tokens = next(tokens for request, tokens in requests if request == event.request)
            if int(event.flags) & TOKEN:
                tokens.append(int(event.token))
            if event.finish_reason == og.FinishReason.FAILED:
                failures.append(str(event.error_code))
    else:
        raise AssertionError("og.Engine still had pending requests after MAX_STEPS runs")
    return [tokens for _, tokens in requests], failures


def generator(model: og.Model, prompt: Sequence[int], new_tokens: int, **search) -> og.Generator:
    """A greedy og.Generator with `prompt` appended (search options override the defaults)."""
    params = og.GeneratorParams(model)
    params.set_search_options(
        **{"do_sample": False, "max_length": len(prompt) + new_tokens, **search}
    )
    made = og.Generator(model, params)
    made.append_tokens(np.asarray([prompt], dtype=np.int32))
    return made


def finish(made: og.Generator, prompt_length: int, index: int = 0) -> list[int]:
    """Run `made` to its end; the tokens of sequence `index` after the prompt."""
    while not made.is_done():
        made.generate_next_token()
    return [int(t) for t in made.get_sequence(index)][prompt_length:]


def alone(model: og.Model, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The greedy tokens og.Generator gives `prompt` alone."""
    return finish(generator(model, prompt, new_tokens), len(prompt))
