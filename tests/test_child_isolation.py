"""Every kind of child process mobius-genai starts runs isolated: modules planted in the working
folder (a checkpoint folder the user packages from) or on PYTHONPATH never run in it, and it
still works, importing this copy of mobius_genai (an editable install here)."""

from __future__ import annotations

import operator
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import mobius_genai
from mobius_genai.bench.runner import bench
from mobius_genai.bundle.chat_template import check_chat_template
from mobius_genai.ep import get_ep
from mobius_genai.quantize import search_pool
from mobius_genai.runtime.smoke import smoke_test

#: Modules a child imports early (or Python's start-up imports), each planted as a file that
#: leaves a marker when it runs.
PLANTED = (
    "numpy",
    "onnx",
    "onnxruntime",
    "onnxruntime_genai",
    "json",
    "pickle",
    "sitecustomize",
    "usercustomize",
)


@pytest.fixture(params=["working folder", "PYTHONPATH"])
def planted(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A folder of planted modules made the working folder or put on PYTHONPATH; yields the
    folder their markers would appear in."""
    plants, markers = tmp_path / "plants", tmp_path / "markers"
    plants.mkdir()
    markers.mkdir()
    for name in PLANTED:
        (plants / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'w').close()\nraise ImportError('planted {name} ran')\n"
        )
    if request.param == "working folder":
        monkeypatch.chdir(plants)
    else:
        monkeypatch.setenv("PYTHONPATH", str(plants))
    search_pool._close_pool()  # workers started before would not be new children
    yield markers
    search_pool._close_pool()


def _nothing_ran(markers: Path) -> None:
    assert sorted(path.name for path in markers.iterdir()) == []


def test_the_smoke_test_process(planted: Path, packaged: Callable[[str], Path]):
    result = smoke_test(packaged("cpu"), get_ep("cpu"), max_new_tokens=2)
    assert result.ran and len(result.tokens) == 2
    _nothing_ran(planted)


def test_the_bench_processes(planted: Path, packaged: Callable[[str], Path]):
    rows = bench(packaged("cpu"), prompt_lengths=[4], batch_sizes=[1], new_tokens=2, rounds=1)
    assert len(rows) == 1 and rows[0].decode_tps > 0
    _nothing_ran(planted)


def test_the_chat_template_check_process(planted: Path, packaged: Callable[[str], Path]):
    assert check_chat_template(packaged("cpu")).startswith("{% for message in messages %}")
    _nothing_ran(planted)


def test_the_search_workers_import_this_copy_of_mobius_genai(planted: Path):
    files = search_pool.map_chunks(
        pkgutil.resolve_name, ["mobius_genai:__file__"] * 3, parallel=True, workers=2
    )
    assert list(files) == [mobius_genai.__file__] * 3
    # -I: PYTHON* variables and the user's site-packages (its usercustomize) ignored too
    names = ["sys:flags.isolated", "sys:flags.ignore_environment", "sys:flags.no_user_site"]
    flags = search_pool.map_chunks(pkgutil.resolve_name, names, parallel=True, workers=2)
    assert list(flags) == [1, 1, 1]
    negated = search_pool.map_chunks(operator.neg, [np.ones(2)] * 3, parallel=True, workers=2)
    assert [chunk.tolist() for chunk in negated] == [[-1.0, -1.0]] * 3
    _nothing_ran(planted)
