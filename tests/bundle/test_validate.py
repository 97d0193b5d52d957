"""`validate`: good bundles pass; each kind of broken bundle fails naming the field or file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.cli import main
from mobius_genai.errors import BundleError
from tests.test_json import HOSTILE


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document))


def _edit_config(folder: Path, edit: Callable[[dict], None]) -> None:
    _edit_json(folder / "genai_config.json", edit)


def _decoder(document: dict) -> dict:
    return document["model"]["decoder"]


@pytest.mark.parametrize("ep", ["cpu", "default", "cuda", "trt-rtx", "webgpu", "dml", "mlx"])
def test_packaged_bundles_are_valid(packaged, ep: str):
    report = validate_bundle(packaged(ep))
    assert report.manifest is not None
    assert report.genai_config["model"]["decoder"]["num_hidden_layers"] == 2


def test_cli_validate_ok(packaged, capsys: pytest.CaptureFixture[str]):
    assert main(["validate", str(packaged("cpu"))]) == 0
    assert "valid (qwen2, 2 layers, checksums match the manifest)" in capsys.readouterr().out


def test_bundle_of_another_tool_without_manifest(bundle_copy):
    """onnxruntime-genai's builder writes more keys and defaults; no manifest, no name maps."""
    folder = bundle_copy()
    (folder / "mobius_manifest.json").unlink()

    def builder_style(document: dict) -> None:
        decoder = _decoder(document)
        decoder.pop("inputs")
        decoder.pop("outputs")
        decoder["session_options"]["log_id"] = "onnxruntime-genai"
        document["search"].update({"early_stopping": True, "random_seed": -1})

    _edit_config(folder, builder_style)
    assert validate_bundle(folder).manifest is None


def _weights_outside(folder: Path) -> None:
    """The graph reads its weights from ../secret.data, beside the bundle folder."""
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../secret.data"
    onnx.save(proto, str(folder / "model.onnx"))
    (folder / "model.onnx.data").rename(folder.parent / "secret.data")


def _manifest_lists(folder: Path, name: str) -> None:
    _edit_json(
        folder / "mobius_manifest.json",
        lambda d: d["files"].update({name: {"sha256": "0" * 64, "size": 1}}),
    )


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "no genai_config": (
        lambda f: (f / "genai_config.json").unlink(),
        "genai_config.json is missing",
    ),
    "not json": (
        lambda f: (f / "genai_config.json").write_text("{"),
        "genai_config.json: not readable as JSON",
    ),
    "schema": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(head_size="16")),
        "model.decoder.head_size: '16' is not of type 'integer'",
    ),
    "head size": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(head_size=8)),
        "model.decoder.head_size: 8 but graph input 'past_key_values.0.key' has 16 at dim 3",
    ),
    "kv heads": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(num_key_value_heads=4)),
        "model.decoder.num_key_value_heads: 4 but graph input 'past_key_values.0.key' has 2",
    ),
    "too many layers": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(num_hidden_layers=3)),
        "model.decoder.inputs.past_key_names: graph lacks ['past_key_values.2.key']",
    ),
    "too few layers": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(num_hidden_layers=1)),
        "model.decoder.num_hidden_layers: 1 but the graph has 2 'past_key_values.%d.key'",
    ),
    "past name": (
        lambda f: _edit_config(
            f, lambda d: _decoder(d)["inputs"].update(past_key_names="past.%d.key")
        ),
        "model.decoder.inputs.past_key_names: graph lacks ['past.0.key'",
    ),
    "logits name": (
        lambda f: _edit_config(f, lambda d: _decoder(d)["outputs"].update(logits="scores")),
        "model.decoder.outputs.logits: 'scores' is not a graph output",
    ),
    "position_ids not in graph": (
        lambda f: _edit_config(f, lambda d: _decoder(d)["inputs"].update(position_ids="positions")),
        "model.decoder.inputs.position_ids: 'positions' is not a graph input",
    ),
    "vocab": (
        lambda f: _edit_config(f, lambda d: d["model"].update(vocab_size=100)),
        "model.vocab_size: 100 but graph output 'logits' has 384 logits per token",
    ),
    "decoder file": (
        lambda f: (f / "model.onnx").unlink(),
        "model.decoder.filename 'model.onnx' is not a file",
    ),
    "weights outside the bundle": (
        _weights_outside,
        "../secret.data: outside the bundle folder; accepted: a file in it",
    ),
    "decoder file by absolute path": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(filename=str(f / "model.onnx"))),
        "model.decoder.filename: '/",
    ),
    "tokenizer_dir outside": (
        lambda f: _edit_config(f, lambda d: d["model"].update(tokenizer_dir="..")),
        "model.tokenizer_dir: '..' is not a path inside the bundle folder",
    ),
    "custom ops library outside": (
        lambda f: _edit_config(
            f, lambda d: _decoder(d)["session_options"].update(custom_ops_library="/tmp/x.so")
        ),
        "model.decoder.session_options.custom_ops_library: '/tmp/x.so' is not a path inside",
    ),
    "manifest names a file outside": (
        lambda f: _manifest_lists(f, "../secret.data"),
        "../secret.data: listed in mobius_manifest.json but outside the bundle folder",
    ),
    "attention heads": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(num_attention_heads=8)),
        "model.decoder.num_attention_heads: 8 but the graph's attention has [4] heads",
    ),
    "hidden size": (
        lambda f: _edit_config(f, lambda d: _decoder(d).update(hidden_size=128)),
        "model.decoder.hidden_size: 128 but graph input 'input_ids' gathers embeddings of width 64",
    ),
    "context beyond the rotary tables": (
        lambda f: _edit_config(f, lambda d: d["model"].update(context_length=256)),
        "model.context_length: 256 but the graph's rotary cos/sin tables cover 128 positions",
    ),
    "weights missing": (
        lambda f: (f / "model.onnx.data").unlink(),
        "model.onnx.data: missing",
    ),
    "weights truncated": (
        lambda f: (f / "model.onnx.data").write_bytes((f / "model.onnx.data").read_bytes()[:1000]),
        "model.onnx.data: 1000 bytes but the graph reads up to byte",
    ),
    "tokenizer": (
        lambda f: (f / "tokenizer.json").unlink(),
        "tokenizer: none of ['tokenizer.json', 'tokenizer.model'] present",
    ),
    "tokenizer not json": (
        lambda f: (f / "tokenizer.json").write_text('{"model": '),
        "tokenizer.json: not readable as JSON",
    ),
    "tokenizer config not json": (
        lambda f: (f / "tokenizer_config.json").write_text("{'chat_template': 1}"),
        "tokenizer_config.json: not readable as JSON",
    ),
    "eos outside the vocabulary": (
        lambda f: _edit_config(f, lambda d: d["model"].update(eos_token_id=[383, 500])),
        "model.eos_token_id: [500] outside the vocabulary [0, 384) of graph output 'logits'",
    ),
    "added token outside the vocabulary": (
        lambda f: _edit_json(
            f / "tokenizer.json", lambda d: d["added_tokens"].append({"id": 400, "content": "<x>"})
        ),
        "tokenizer.json: added token '<x>': [400] outside the vocabulary [0, 384) of graph "
        "output 'logits'",
    ),
    "added_tokens_decoder outside the vocabulary": (
        lambda f: _edit_json(
            f / "tokenizer_config.json",
            lambda d: d["added_tokens_decoder"].update({"384": {"content": "<y>"}}),
        ),
        "tokenizer_config.json: added token '<y>': [384] outside the vocabulary [0, 384)",
    ),
    "pad outside the vocabulary": (
        lambda f: _edit_config(f, lambda d: d["model"].update(pad_token_id=-1)),
        "model.pad_token_id: [-1] outside the vocabulary",
    ),
    "share buffer without GQA": (
        lambda f: _edit_config(f, lambda d: d["search"].update(past_present_share_buffer=True)),
        "search.past_present_share_buffer: true but the graph has no "
        "com.microsoft::GroupQueryAttention",
    ),
    "graph capture without shared buffer": (
        lambda f: _edit_config(
            f,
            lambda d: _decoder(d)["session_options"].update(
                provider_options=[{"cuda": {"enable_cuda_graph": "1"}}]
            ),
        ),
        "model.decoder.session_options.provider_options.cuda.enable_cuda_graph: graph capture "
        "is on",
    ),
    "dml captures unless told not to": (
        lambda f: _edit_config(
            f, lambda d: _decoder(d)["session_options"].update(provider_options=[{"dml": {}}])
        ),
        "provider_options.dml.enable_graph_capture: graph capture is on",
    ),
    "file changed after packaging": (
        lambda f: (f / "tokenizer_config.json").write_text(
            (f / "tokenizer_config.json").read_text().replace("{", "{ ", 1)[:-1]
        ),
        "tokenizer_config.json: sha256 differs from mobius_manifest.json",
    ),
    "manifest lists a missing file": (
        lambda f: (f / "merges.txt").unlink(),
        "merges.txt: listed in mobius_manifest.json but missing",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_broken_bundle_is_reported_naming_the_field(bundle_copy, breakage: str, capsys):
    folder = bundle_copy("default")  # the portable graph: no GroupQueryAttention
    damage, named = BROKEN[breakage]
    damage(folder)
    with pytest.raises(BundleError) as caught:
        validate_bundle(folder)
    assert named in str(caught.value)
    assert main(["validate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mobius-genai: error: ") and named in err
    assert err.count("\n") == 1


def test_gqa_bundle_shares_the_buffer_and_may_capture(bundle_copy):
    folder = bundle_copy("cpu")
    report = validate_bundle(folder)
    assert report.graph.has_gqa
    assert report.genai_config["search"]["past_present_share_buffer"] is True
    (folder / "mobius_manifest.json").unlink()
    _edit_config(
        folder,
        lambda d: _decoder(d)["session_options"].update(
            provider_options=[{"cuda": {"enable_cuda_graph": "1"}}]
        ),
    )
    validate_bundle(folder)


def test_skip_hashes_still_checks_sizes(bundle_copy):
    folder = bundle_copy()
    text = (folder / "vocab.json").read_text()
    (folder / "vocab.json").write_text(text.replace('"', "'", 2))  # same size, new content
    validate_bundle(folder, check_hashes=False)
    with pytest.raises(BundleError, match="vocab.json: sha256 differs"):
        validate_bundle(folder)


def test_not_a_folder(tmp_path: Path):
    assert main(["validate", str(tmp_path / "nowhere")]) == 1


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize(
    "name",
    ["genai_config.json", "mobius_manifest.json", "tokenizer.json", "tokenizer_config.json"],
)
def test_bundle_json_files(bundle_copy, kind, name):
    folder = bundle_copy("default")
    text, words = HOSTILE[kind]
    (folder / name).write_text(text)
    with pytest.raises(BundleError, match=f"{name}: not readable as JSON .*{words}"):
        validate_bundle(folder)


def test_gqa_graph_heads_are_compared(bundle_copy):
    folder = bundle_copy("cpu")
    _edit_config(folder, lambda d: _decoder(d).update(num_attention_heads=2))
    with pytest.raises(
        BundleError, match=r"num_attention_heads: 2 but the graph's attention has \[4\]"
    ):
        validate_bundle(folder)


def test_graph_facts_of_each_kind_of_graph(packaged, tiny_int4):
    """The sizes of tiny-qwen2's config.json, read from the portable, GQA and INT4 graphs."""
    for folder in (packaged("default"), packaged("cpu"), tiny_int4):
        graph = GraphInfo.from_file(folder / "model.onnx")
        assert (graph.attention_heads, graph.attention_kv_heads) == ({4}, {2})
        assert graph.embedding_widths == {"input_ids": {64}}
        assert graph.rotary_positions == 128


def test_paths_are_checked_at_any_depth_of_genai_config(bundle_copy):
    folder = bundle_copy("default")
    depth = 500
    text = (folder / "genai_config.json").read_text()
    deep = '{"a": ' * depth + '{"tokenizer_dir": ".."}' + "}" * depth
    (folder / "genai_config.json").write_text(
        text.replace('"model": {', f'"engine": {deep}, "model": {{', 1)
    )
    with pytest.raises(BundleError, match=r"engine(\.a)+\.tokenizer_dir: '\.\.' is not a path"):
        validate_bundle(folder)


def test_the_graph_says_which_ep_it_was_built_for(bundle_copy):
    """A dml graph (rotary outside GroupQueryAttention) under cuda's provider is refused; the
    same graph with no provider (CPU) is fine, as is a portable graph under any provider."""
    folder = bundle_copy("dml")
    assert validate_bundle(folder).graph.built_for == "dml"
    (folder / "mobius_manifest.json").unlink()  # the edits below change genai_config.json
    _edit_config(
        folder, lambda d: _decoder(d)["session_options"].update(provider_options=[{"cuda": {}}])
    )
    with pytest.raises(BundleError, match="names 'cuda' but the graph was built for dml"):
        validate_bundle(folder)
    _edit_config(folder, lambda d: _decoder(d)["session_options"].update(provider_options=[]))
    validate_bundle(folder)
    portable = bundle_copy("default")
    (portable / "mobius_manifest.json").unlink()
    _edit_config(
        portable,
        lambda d: (
            _decoder(d).setdefault("session_options", {}).update(provider_options=[{"cuda": {}}])
        ),
    )
    assert validate_bundle(portable).graph.built_for == "default"
