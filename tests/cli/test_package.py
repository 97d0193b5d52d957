"""`mobius-genai package / validate / run`: results, and bad input that writes nothing."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mobius_genai import packager
from mobius_genai.bundle.chat_template import chat_template
from mobius_genai.cli import main
from tests.conftest import TINY_QWEN2


def _checkpoint(tmp_path: Path, edit: Callable[[Path], None] | None = None) -> Path:
    folder = shutil.copytree(TINY_QWEN2, tmp_path / "ckpt")
    if edit is not None:
        edit(folder)
    return folder


def _edit_config_json(**changes: object) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return edit


def _truncate_weights(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_package_prints_the_bundle_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["package", str(TINY_QWEN2), "--ep", "cuda", "--quiet", "--no-smoke-test"]
    assert main(args) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(tmp_path / "tiny-qwen2-cuda-fp16")
    manifest = json.loads((Path(out) / "mobius_manifest.json").read_text())
    assert (manifest["build"]["dtype"], manifest["build"]["precision"]) == ("fp16", "fp16")


def test_an_int4_option_implies_int4_and_the_help_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["package", str(TINY_QWEN2), "--ep", "cpu", "--quiet", "--no-smoke-test"]
    assert main([*args, "--int4-quality", "builder"]) == 0
    manifest = json.loads((tmp_path / "tiny-qwen2-cpu-int4" / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == "int4"
    assert manifest["build"]["quantization"]["quality"] == "builder"
    with pytest.raises(SystemExit):
        main(["package", "--help"])
    assert "implies --precision int4" in " ".join(capsys.readouterr().out.split())


def test_package_options(tmp_path, capsys):
    out = tmp_path / "b"
    args = [
        "package",
        str(TINY_QWEN2),
        "--ep",
        "cpu",
        "-o",
        str(out),
        "--precision",
        "fp16",
        "--context-length",
        "48",
        "--quiet",
    ]
    assert main(args) == 0
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["context_length"] == config["search"]["max_length"] == 48
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    assert manifest["build"]["dtype"] == "fp16"
    assert manifest["source"]["model_id"] == TINY_QWEN2.name
    assert "model.safetensors" in manifest["source"]["files"]
    assert sorted(manifest["files"]) == sorted(
        p.name for p in out.iterdir() if p.name != "mobius_manifest.json"
    )
    readme = (out / "README.md").read_text()
    assert 'og.Model("b")' in readme and "| Context length | 48 tokens |" in readme


def test_package_trace_goes_to_stderr(tmp_path, capsys):
    args = ["package", str(TINY_QWEN2), "--ep", "cuda", "-o", str(tmp_path / "t"), "--trace"]
    assert main([*args, "--quiet", "--no-smoke-test"]) == 0
    captured = capsys.readouterr()
    assert "[EP Trace] Target: cuda" in captured.err
    assert captured.out.strip() == str(tmp_path / "t")
    manifest = json.loads((tmp_path / "t" / "mobius_manifest.json").read_text())
    assert manifest["build"]["optimization"]["GQAFusion"] == 2  # fired rules, with counts
    assert all(count > 0 for count in manifest["build"]["optimization"].values())


BAD_INPUT: dict[str, tuple[list[str], Callable[[Path], None] | None, str]] = {
    "unknown EP": (["--ep", "tpu"], None, "Unknown execution provider 'tpu'"),
    "int4 options with a float precision": (
        ["--precision", "fp16", "--int4-block-size", "64"],
        None,
        "int4 options were given for precision 'fp16'",
    ),
    "int4 block size not a power of two": (
        ["--precision", "int4", "--int4-block-size", "48"],
        None,
        "int4 block size 48 is not accepted",
    ),
    "int4 block size not dividing K": (
        ["--precision", "int4", "--int4-block-size", "256"],
        None,
        "block size",
    ),
    "bf16 on an EP without bf16 kernels": (
        ["--ep", "cpu", "--precision", "bf16"],
        None,
        "execution provider 'cpu' does not run bf16 models",
    ),
    "dtype contradicts precision": (
        ["--dtype", "f16", "--precision", "fp32"],
        None,
        "contradicts precision 'fp32'",
    ),
    "missing config.json": ([], lambda f: (f / "config.json").unlink(), "config.json"),
    "no tokenizer": ([], lambda f: (f / "tokenizer.json").unlink(), "no tokenizer (none of"),
    "unsupported model_type": ([], _edit_config_json(model_type="bert"), "bert"),
    "truncated safetensors": ([], _truncate_weights, "model.safetensors"),
    "heads not dividing hidden": (
        [],
        _edit_config_json(num_attention_heads=5, head_dim=None),
        "not divisible by num_attention_heads 5",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_fails_cleanly_and_writes_nothing(tmp_path, capsys, case: str):
    extra, edit, named = BAD_INPUT[case]
    checkpoint = _checkpoint(tmp_path, edit)
    before = sorted(p.name for p in checkpoint.iterdir())
    out = tmp_path / "out"
    assert main(["package", str(checkpoint), "-o", str(out), "--quiet", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mobius-genai: error: ") and named in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in checkpoint.iterdir()) == before


def test_existing_output_without_force_is_kept(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    for command in (["package", str(TINY_QWEN2), "--quiet"], ["build", str(TINY_QWEN2)]):
        assert main([*command, "-o", str(out)]) == 1
        err = capsys.readouterr().err
        # the command line's option, not the Python keyword
        assert "not empty" in err and "--force" in err and "force=True" not in err
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_ctrl_c_during_the_build_writes_nothing(tmp_path, capsys, monkeypatch):
    real_build = packager.build

    def interrupted(*args, **kwargs):
        real_build(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(packager, "build", interrupted)
    assert main(["package", str(TINY_QWEN2), "-o", str(tmp_path / "out"), "--quiet"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_run_streams_text_with_the_chat_template(packaged, capsys):
    folder = packaged("cpu")
    assert chat_template(folder) is not None
    assert main(["run", str(folder), "--prompt", "Hi", "--max-new-tokens", "5"]) == 0
    chat = capsys.readouterr().out
    assert main(["run", str(folder), "--prompt", "Hi", "--max-new-tokens", "5", "--raw"]) == 0
    raw = capsys.readouterr().out
    assert chat.endswith("\n") and raw.endswith("\n")
    assert chat != raw  # the template changes the prompt, so the continuation


def test_chat_template_sources(tmp_path: Path):
    assert chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": [{"name": "default", "template": "{{ x }}"}]})
    )
    assert chat_template(tmp_path) == "{{ x }}"
    (tmp_path / "chat_template.jinja").write_text("{{ y }}")
    assert chat_template(tmp_path) == "{{ y }}"


def test_run_on_a_missing_bundle_fails(tmp_path, capsys):
    assert main(["run", str(tmp_path), "--prompt", "Hi"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}: not a bundle (no genai_config.json)" in err and "looks like" not in err


def test_run_on_a_checkpoint_says_to_package_it(capsys):
    assert main(["run", str(TINY_QWEN2), "--prompt", "Hi"]) == 1
    assert f"`mobius-genai package {TINY_QWEN2}` makes a bundle of it" in capsys.readouterr().err


def test_the_smoke_note_names_a_missing_ep_once(tmp_path, capsys):
    assert main(["package", str(TINY_QWEN2), "--ep", "cuda", "-o", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "smoke test on CPU (the cuda EP is not available here)" in err
    assert "EP (cuda)" not in err


def test_validate_on_a_checkpoint_says_to_package_it(capsys):
    assert main(["validate", str(TINY_QWEN2)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"`mobius-genai package {TINY_QWEN2}` makes a bundle of it" in err


def test_a_model_that_is_a_file_says_a_gguf_file_is_accepted(tmp_path, capsys):
    (tmp_path / "model.bin").write_bytes(b"weights")
    assert main(["package", str(tmp_path / "model.bin"), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "model.bin': is a file; accepted: a .gguf file, a local checkpoint folder" in err
    assert not (tmp_path / "out").exists()


def test_an_os_error_while_packaging_is_one_line(tmp_path, capsys, monkeypatch):
    def disk_full(built, folder, progress=True, action="saving"):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "model.onnx.data"))

    monkeypatch.setattr(packager, "save_with_digest", disk_full)
    out = tmp_path / "out"
    assert main(["package", str(TINY_QWEN2), "-o", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mobius-genai: error: packaging {TINY_QWEN2} failed: [Errno 28]")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "said"),
    [
        (["--ep", "foo"], "Unknown execution provider 'foo'"),
        (["--dtype", "fp8"], "fp8"),
    ],
)
def test_bad_options_are_said_before_the_source_is_read(option, said, capsys, monkeypatch):
    """A hub id is resolved (and downloaded) only once the choices that need no source pass."""
    read: list[str] = []
    monkeypatch.setattr(
        "mobius_genai.cli._package.stored_bits", lambda model, revision: read.append(model)
    )
    assert main(["package", "some-org/some-model", *option]) == 1
    assert said in capsys.readouterr().err
    assert read == []
