"""Bad input at onnxruntime-genai's level: what og 0.18 raises (several lines: parser states,
ORT statuses) becomes one line saying what was wrong and what is accepted (og_error_line, for
`run` and `chat`). Every exception here is og's own, raised through its public API."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime_genai as og
import pytest

from mobius_genai.bundle._og_errors import og_error_line
from tests.runtime._og import PROMPTS


def _raised(action) -> BaseException:
    with pytest.raises(RuntimeError) as error:
        action()
    return error.value


def _line(error: BaseException) -> str:
    line = og_error_line(error)
    assert "\n" not in line and line == " ".join(line.split())
    return line


@pytest.fixture(scope="module")
def model(dense) -> og.Model:
    return og.Model(str(dense.bundle))


def _context(dense) -> int:
    return json.loads((dense.bundle / "genai_config.json").read_text())["model"]["context_length"]


def test_engine_request_longer_than_the_context(dense, model):
    context = _context(dense)
    engine = og.Engine(model)
    request = engine.create_request()
    prompt = np.arange(context + 5, dtype=np.int32) % 380
    error = _raised(lambda: request.begin_turn(prompt, og.TurnOptions(request)))
    line = _line(error)
    assert line.startswith("the request is too long:")
    assert f"{context + 5} new tokens after 0" in line and f"within {context} tokens" in line


def test_generator_prompt_longer_than_max_length(model):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=10)
    made = og.Generator(model, params)
    error = _raised(lambda: made.append_tokens(np.asarray([list(range(3, 23))], np.int32)))
    assert "20 new tokens after 0 leave no room to generate within 10 tokens" in _line(error)


def test_turn_after_a_cancelled_turn(model):
    """og refuses a new turn until the cancelled one's events are read; after that it runs."""
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(8)
    request = engine.create_request()
    options = og.TurnOptions(request)
    options.set_max_generated_tokens(20)
    turn = request.begin_turn(np.asarray(PROMPTS[0], np.int32), options)
    list(engine.run(buffer))
    assert request.cancel_turn(turn)
    error = _raised(lambda: request.begin_turn(np.asarray([17, 92], np.int32)))
    assert _line(error).startswith("a turn began before the previous turn's events were read;")
    reasons = [event.finish_reason for event in engine.run(buffer)]
    assert og.FinishReason.CANCELLED in reasons
    request.begin_turn(np.asarray([17, 92], np.int32))  # now accepted
    tokens = []
    while engine.has_pending_requests():
        tokens += [event.token for event in engine.run(buffer) if event.token is not None]
    assert tokens


@pytest.mark.parametrize(
    ("kind", "grammar", "said"),
    [
        (
            "json_schema",
            json.dumps({"type": "integer", "minimum": 5, "maximum": 1}),
            "guidance refused: Unsatisfiable schema: minimum (5) is greater than maximum (1);",
        ),
        (
            "json_schema",
            json.dumps({"allOf": [{"type": "string"}, {"type": "integer"}]}),
            "guidance refused: Unsatisfiable schema: incompatible types;",
        ),
        ("regex", "([", "guidance refused: at 1(8): invalid regex"),
        ("yaml", "x: 1", "guidance type 'yaml' is not supported; accepted: json_schema, regex"),
    ],
)
def test_guidance_that_cannot_match(model, kind, grammar, said):
    engine = og.Engine(model)
    request = engine.create_request()
    options = og.TurnOptions(request)

    def begin():
        options.set_guidance(kind, grammar)
        request.begin_turn(np.asarray(PROMPTS[0], np.int32), options)

    assert _line(_raised(begin)).startswith(said)
    params = og.GeneratorParams(model)  # og.Generator says the same
    params.set_search_options(max_length=20)

    def generate():
        params.set_guidance(kind, grammar)
        og.Generator(model, params)

    assert _line(_raised(generate)).startswith(said)


def test_engine_refusing_a_model_type(lfm2):
    error = _raised(lambda: og.Engine(og.Model(str(lfm2.bundle))))
    assert _line(error).startswith("og.Engine does not run this model type")


def test_unknown_message_keeps_ogs_first_line():
    error = RuntimeError("Something new\n  with details\n")
    assert og_error_line(error) == "onnxruntime-genai: Something new"


def test_failed_engine_says_ogs_cause_in_one_line(pruned):
    """A pruned bundle fails the Engine's turn; the next begin_turn raises og's cause."""
    engine = og.Engine(og.Model(str(pruned.bundle)))
    request = engine.create_request()
    request.begin_turn(np.asarray(PROMPTS[0], np.int32))
    list(engine.run(engine.create_event_buffer(4)))
    error = _raised(lambda: request.begin_turn(np.asarray(PROMPTS[0], np.int32)))
    assert _line(error) == (
        "og.Engine failed and must be created again: Got invalid dimensions for output: logits "
        "for the following indices index: 1 Got: 8 Expected: 1"
    )
