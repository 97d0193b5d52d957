"""build_context: defaults, nesting, restore on exceptions, isolation across threads and tasks."""

from __future__ import annotations

import asyncio
import threading

import onnx_ir as ir
import pytest

from mobius_genai.ep import (
    BuildContext,
    build_context,
    current_build_context,
    ep_capabilities,
    ep_registry,
    get_build_dtype,
)

F32 = ir.DataType.FLOAT
F16 = ir.DataType.FLOAT16
BF16 = ir.DataType.BFLOAT16


def _state() -> tuple[str, ir.DataType]:
    return ep_capabilities().name, get_build_dtype()


def test_defaults_outside_any_context():
    assert ep_capabilities() is ep_registry.require("default")
    assert get_build_dtype() == F32
    assert current_build_context() == BuildContext(ep_registry.require("default"), F32)


def test_context_sets_caps_and_dtype():
    cuda = ep_registry.require("cuda")
    with build_context(cuda, F16) as context:
        assert context == BuildContext(cuda, F16)
        assert ep_capabilities() is cuda
        assert get_build_dtype() == F16
    assert _state() == ("default", F32)


def test_context_accepts_ep_name_and_alias():
    with build_context("dml", F16):
        assert ep_capabilities() is ep_registry.require("dml")
    with build_context("portable", F32):
        assert ep_capabilities().name == "default"


def test_dtype_defaults_to_the_eps_default_dtype():
    with build_context("cuda"):
        assert get_build_dtype() == F16
    with build_context("cpu"):
        assert get_build_dtype() == F32


def test_unknown_ep_name_raises_before_entering():
    unknown = pytest.raises(ValueError, match=r"^Unknown execution provider 'rocm'\. Supported: ")
    with unknown, build_context("rocm", F16):
        pytest.fail("entered the context")
    assert _state() == ("default", F32)


@pytest.mark.parametrize("caps", [None, 3, object()])
def test_bad_caps_type_is_rejected(caps: object):
    bad_caps = pytest.raises(TypeError, match=r"expects EpCapabilities or an EP name")
    with bad_caps, build_context(caps, F16):  # type: ignore[arg-type]
        pytest.fail("entered the context")


def test_bad_dtype_is_rejected():
    bad_dtype = pytest.raises(TypeError, match=r"expects an ir\.DataType dtype, got 'float16'")
    with bad_dtype, build_context("cuda", "float16"):  # type: ignore[arg-type]
        pytest.fail("entered the context")


def test_nesting_shadows_and_restores():
    with build_context("cuda", F16):
        with build_context("webgpu", F32):
            assert _state() == ("webgpu", F32)
            with build_context("trt-rtx", BF16):
                assert _state() == ("trt-rtx", BF16)
            assert _state() == ("webgpu", F32)
        assert _state() == ("cuda", F16)
    assert _state() == ("default", F32)


def test_exception_restores_outer_context():
    class Boom(Exception):
        pass

    with build_context("cuda", F16):
        with pytest.raises(Boom), build_context("dml", F16):
            assert _state() == ("dml", F16)
            raise Boom
        assert _state() == ("cuda", F16)
    with pytest.raises(Boom), build_context("cpu", F32):
        raise Boom
    assert _state() == ("default", F32)


def test_threads_are_isolated():
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, tuple[str, ir.DataType]] = {}
    errors: list[BaseException] = []

    def work(ep: str, dtype: ir.DataType) -> None:
        try:
            with build_context(ep, dtype):
                barrier.wait()  # both contexts are now set at the same time
                seen[ep] = _state()
                barrier.wait()  # neither exits before the other has read its own
            seen[f"{ep}-after"] = _state()
        except BaseException as error:  # surfaced in the main thread
            errors.append(error)
            barrier.abort()

    with build_context("webgpu", F32):  # a context in the main thread does not leak into threads
        threads = [
            threading.Thread(target=work, args=("cuda", F16)),
            threading.Thread(target=work, args=("dml", BF16)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert _state() == ("webgpu", F32)

    assert not errors, errors
    assert seen == {
        "cuda": ("cuda", F16),
        "dml": ("dml", BF16),
        "cuda-after": ("default", F32),
        "dml-after": ("default", F32),
    }


def test_asyncio_tasks_are_isolated():
    both_entered = asyncio.Event()
    entered: list[str] = []

    async def build(ep: str, dtype: ir.DataType) -> tuple[tuple[str, ir.DataType], ...]:
        with build_context(ep, dtype):
            before = _state()
            entered.append(ep)
            if len(entered) == 2:
                both_entered.set()
            await both_entered.wait()  # the other task has set its own context meanwhile
            await asyncio.sleep(0)
            after = _state()
        return before, after, _state()

    async def main() -> list[tuple[tuple[str, ir.DataType], ...]]:
        return list(await asyncio.gather(build("cuda", F16), build("dml", F16)))

    cuda, dml = asyncio.run(main())
    assert cuda == (("cuda", F16), ("cuda", F16), ("default", F32))
    assert dml == (("dml", F16), ("dml", F16), ("default", F32))
    assert _state() == ("default", F32)


@pytest.mark.parametrize("ep", ["cuda", "dml", None])
def test_the_task_records_the_context_ep_in_the_model(ep):
    """CausalLMTask reads ep_capabilities(): the graph's metadata names the EP it is for."""
    from mobius_genai.models import CausalLMModel
    from mobius_genai.tasks.causal_lm import BUILT_FOR_KEY, CausalLMTask
    from tests.optimize._graphs import tiny_config

    config = tiny_config()
    if ep is None:
        model = CausalLMTask().build(CausalLMModel(config), config)
    else:
        with build_context(ep):
            model = CausalLMTask().build(CausalLMModel(config), config)
    assert model.metadata_props[BUILT_FOR_KEY] == (ep or "default")
