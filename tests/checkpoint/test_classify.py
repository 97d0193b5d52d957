"""One classification of the model argument (`source.classify`), and the commands that take a
model argument agreeing with it: what is opened, the bundle's name, the folder protected."""

from __future__ import annotations

from pathlib import Path

import pytest

import mobius_genai
from mobius_genai.bundle.output_folder import checkpoint_folder
from mobius_genai.checkpoint.opening import open_checkpoint, stored_bits
from mobius_genai.checkpoint.source import ArgumentKind, classify, model_name
from mobius_genai.errors import ConfigError
from mobius_genai.packager import bundle_name
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.conftest import TINY_QWEN2


def test_a_checkpoint_folder(tmp_path: Path):
    argument = classify(TINY_QWEN2)
    assert (argument.kind, argument.path, argument.folder) == (
        ArgumentKind.FOLDER,
        TINY_QWEN2,
        TINY_QWEN2,
    )
    assert argument.name == "tiny-qwen2"
    assert checkpoint_folder(TINY_QWEN2) == ((TINY_QWEN2, "the checkpoint"),)
    assert open_checkpoint(TINY_QWEN2).source.path == TINY_QWEN2.resolve()


def test_a_gguf_file_and_a_folder_holding_one(tmp_path: Path):
    (tmp_path / "folder").mkdir()
    gguf = write_tiny_gguf(tmp_path / "folder" / "tiny.Q4_0.gguf", "llama")
    file, folder = classify(gguf), classify(gguf.parent)
    assert file.kind is folder.kind is ArgumentKind.GGUF
    assert file.path == folder.path == gguf.resolve()
    assert (file.folder, folder.folder) == (None, gguf.parent)
    assert (file.name, folder.name) == ("tiny.Q4_0", "folder")
    assert bundle_name(gguf, "cpu", "int4") == "tiny.Q4_0-cpu-int4"
    assert checkpoint_folder(gguf) == ()
    assert checkpoint_folder(gguf.parent) == ((gguf.parent, "the checkpoint"),)
    opened = open_checkpoint(gguf.parent)
    assert opened.source.weights == gguf.resolve()
    assert opened.config["model_type"] == "llama"


def test_a_gguf_builds_its_graph_without_weights(tmp_path: Path):
    """load_weights=False reads the GGUF's metadata (its config) and no tensor."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", "llama")
    package = mobius_genai.build(gguf, "cpu", "fp32", load_weights=False, progress=False)
    initializers = package["model"].graph.initializers.values()
    assert package.config.model_type == "llama"
    assert not any(
        value.const_value is not None and value.name.endswith("q_proj.weight")
        for value in initializers
    )


def test_a_config_json_describes_a_graph_only(tmp_path: Path):
    config = TINY_QWEN2 / "config.json"
    argument = classify(config)
    assert (argument.kind, argument.path, argument.folder) == (
        ArgumentKind.CONFIG_JSON,
        config,
        None,
    )
    assert open_checkpoint(config, weights=False).config["model_type"] == "qwen2"
    assert stored_bits(config) == frozenset()
    with pytest.raises(ConfigError, match=r"config.json': is a file; accepted: a .gguf file"):
        open_checkpoint(config)


def test_a_hub_id():
    argument = classify("Qwen/Qwen2.5-0.5B")
    assert (argument.kind, argument.path, argument.folder) == (ArgumentKind.HUB_ID, None, None)
    assert argument.name == model_name("Qwen/Qwen2.5-0.5B") == "Qwen2.5-0.5B"
    assert checkpoint_folder("Qwen/Qwen2.5-0.5B") == ()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("missing", r"'.*missing': no such folder, and not a hub id; accepted: a local"),
        ("a/b/c", r"'a/b/c': no such folder, and not a hub id"),
        ("./org/name", r"'./org/name': no such folder, and not a hub id"),
        ("weights.bin", r"'.*weights.bin': is a file; accepted: a .gguf file, a local checkpoint"),
        ("two", r"'.*two': holds several GGUF files \(a.gguf, b.gguf\); accepted: the path of"),
    ],
)
def test_refusals_name_the_argument_and_what_is_accepted(tmp_path: Path, given: str, message):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two" / name).write_bytes(b"GGUF")
    model = given if "/" in given else str(tmp_path / given)
    with pytest.raises(ConfigError, match=message):
        classify(model)
    with pytest.raises(ConfigError, match=message):
        stored_bits(model)
    with pytest.raises(ConfigError, match=message):
        mobius_genai.build(model, load_weights=False, progress=False)


def test_a_name_that_is_no_local_path_is_named_by_its_last_part(tmp_path: Path):
    """A manifest's model_id (a local folder's name when it was built from one)."""
    assert model_name("tiny-qwen2") == "tiny-qwen2"
    assert model_name(str(tmp_path / "gone")) == "gone"
