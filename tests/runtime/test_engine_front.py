"""`run` and `chat` on onnxruntime-genai's Engine (requests and turns) wherever it runs the
bundle, og.Generator where it does not: the same tokens either way, checked against og's own
Generator; og's refusals and failures as one line.
"""

from __future__ import annotations

import onnxruntime_genai as og
import pytest

from mobius_genai.bundle.bos import required_bos, with_bos
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from mobius_genai.runtime.chat import Conversation
from mobius_genai.runtime.decoding import Decoder
from mobius_genai.runtime.generate import greedy_tokens
from mobius_genai.runtime.opening import open_bundle

PROMPT = "Hello there, how are you"


@pytest.fixture
def engines(monkeypatch) -> list[og.Engine]:
    """Every og.Engine made while the test runs."""
    made = []

    class Recorded(og.Engine):
        def __init__(self, model: og.Model) -> None:
            super().__init__(model)
            made.append(self)

    monkeypatch.setattr(og, "Engine", Recorded)
    return made


def _generator_text(folder, prompt: str, new_tokens: int) -> str:
    """The text og.Generator generates greedily after `prompt` (fed as is), by og's own API."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    ids = with_bos(tokenizer.encode(prompt), required_bos(folder))
    stream = tokenizer.create_stream()
    return "".join(
        stream.decode(token) for token in greedy_tokens(model, ids, len(ids) + new_tokens)
    )


@pytest.mark.parametrize(("kind", "on_engine"), [("full_logits", True), ("pruned", False)])
def test_run_gives_og_generators_text_on_the_engine_where_it_runs(
    kind, on_engine, request, packaged, engines, capsys
):
    folder = packaged("cpu") if on_engine else request.getfixturevalue("pruned_head")
    argv = ["run", str(folder), PROMPT, "--raw", "--max-new-tokens", "12", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == _generator_text(folder, PROMPT, 12) + "\n"
    said = (
        ""
        if on_engine
        else (
            "mobius-genai: og.Engine does not run this bundle: the LM head is pruned to each "
            "sequence's last position"
        )
    )
    assert captured.err.startswith(said) and captured.err.count("\n") == int(not on_engine)
    assert captured.err.endswith("" if on_engine else "; generating with og.Generator\n")
    assert len(engines) == (1 if on_engine else 0)


def test_run_samples_reproducibly_on_the_engine(packaged, engines, capsys):
    def sampled(seed: str) -> str:
        argv = ["run", str(packaged("cpu")), PROMPT, "--max-new-tokens", "16", "--quiet"]
        assert main([*argv, "--temperature", "1.5", "--seed", seed]) == 0
        return capsys.readouterr().out

    assert sampled("1") == sampled("1") != sampled("2")
    assert engines


def test_a_chat_turn_feeds_only_what_follows_the_requests_tokens(packaged):
    conversation = Conversation(packaged("cpu"), max_new_tokens=4)
    assert conversation.decoder.engine is not None
    first = "".join(conversation.reply("ok"))  # a reply whose text encodes to its own tokens
    assert conversation.decoder.fed == len(conversation.prompt_ids)
    second = "".join(conversation.reply("Again"))
    prompt = conversation.prompt_ids
    assert 0 < conversation.decoder.fed < len(prompt) - 4  # the request was continued ...
    stream = conversation.tokenizer.create_stream()
    alone = greedy_tokens(og.Model(str(conversation.folder)), prompt, len(prompt) + 4)
    assert second == "".join(stream.decode(token) for token in alone)  # ... to og's tokens
    assert conversation.turns == [("ok", first), ("Again", second)]


def test_og_refusing_the_model_type_is_said_once_and_the_generator_runs_it(lfm2, engines, capsys):
    folder = lfm2.bundle  # every position's logits (prune_lm_head=False), as og.Engine needs
    with pytest.raises(RuntimeError, match="not supported for decoding"):  # og's own limit
        og.Engine(og.Model(str(folder)))
    assert main(["run", str(folder), PROMPT, "--raw", "--max-new-tokens", "8", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == _generator_text(folder, PROMPT, 8) + "\n"
    [line] = captured.err.splitlines()
    assert line.startswith("mobius-genai: og.Engine does not run this bundle: og 0.18 runs ")
    assert "'The model type is not supported for decoding" in line
    assert line.endswith("; generating with og.Generator")


def test_a_request_longer_than_the_context_is_one_line(packaged, capsys):
    folder = packaged("cpu")
    assert main(["run", str(folder), "x " * 300, "--raw"]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"mobius-genai: error: {folder}: the request was refused: the request is too long: "
    )
    assert "within 128 tokens" in line


def test_a_failed_engine_turn_is_one_line_with_ogs_cause(pruned_head):
    bundle = open_bundle(pruned_head, command="run")
    decoder = Decoder(bundle)
    assert decoder.engine is None  # a pruned LM head: og's Engine fails its requests ...
    decoder.engine = og.Engine(bundle.model)
    with pytest.raises(BundleError) as failed:
        list(decoder.tokens([381, 17, 92], max_new_tokens=4, max_length=64))
    message = str(failed.value)  # ... and says why on its next call
    assert "cannot generate: og.Engine failed and must be created again: " in message
    assert "Got invalid dimensions for output: logits" in message and "\n" not in message
    assert "mobius-genai validate" in message


@pytest.mark.parametrize("kind", ["full_logits", "pruned"])
def test_run_guided_by_a_regex_gives_ogs_guided_text(kind, request, packaged, capsys):
    folder = packaged("cpu") if kind == "full_logits" else request.getfixturevalue("pruned_head")
    assert main(["run", str(folder), PROMPT, "--raw", "--regex", "[0-9]{3}", "--quiet"]) == 0
    text = capsys.readouterr().out.removesuffix("\n")
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    params.set_guidance("regex", "[0-9]{3}")
    generator = og.Generator(model, params)
    tokenizer = og.Tokenizer(model)
    ids = with_bos(tokenizer.encode(PROMPT), required_bos(folder))
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    expected = tokenizer.decode(generator.get_sequence(0)[len(ids) :])
    assert text == expected and len(text) == 3 and text.isdigit()


@pytest.mark.parametrize("kind", ["full_logits", "pruned"])
@pytest.mark.parametrize(
    ("pattern", "said"),
    [
        ("[", "the request was refused: guidance refused: "),  # not a regex
        ("\u4e00\u4e01+", "the reply guided by regex stopped: guidance refused: "),  # no token
    ],
)
def test_guidance_og_refuses_is_one_line(kind, pattern, said, request, packaged, capfd):
    folder = packaged("cpu") if kind == "full_logits" else request.getfixturevalue("pruned_head")
    assert main(["run", str(folder), PROMPT, "--regex", pattern]) == 1
    errors = [
        line
        for line in capfd.readouterr().err.splitlines()
        if line.startswith("mobius-genai") and not line.endswith("generating with og.Generator")
    ]
    assert len(errors) == 1 and said in errors[0] and "<state>" not in errors[0]
