"""Image bytes checked before onnxruntime-genai's decoder: what passes is what og decodes (PNG,
JPEG); a JPEG that would make libjpeg end the process, or og wait forever, never reaches it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mobius_genai.cli import main
from mobius_genai.runtime.image_bytes import MAX_PIXELS, image_pixels, image_refusal
from mobius_genai.runtime.smoke_image import png_bytes
from tests._jpeg import jpeg_bytes

JPEG = jpeg_bytes(np.random.default_rng(0).integers(0, 256, (4, 4, 3), dtype=np.uint8))
PNG = png_bytes(np.zeros((8, 8, 3), np.uint8))
#: The frame header's offset in JPEG (after SOI and the quantization table).
_SOF = JPEG.index(b"\xff\xc0")
_DHT = JPEG.index(b"\xff\xc4")


def _edit(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def test_png_and_jpeg_pass_with_their_sizes():
    assert image_refusal(PNG) is None and image_refusal(JPEG) is None
    assert (image_pixels(PNG), image_pixels(JPEG)) == (8 * 8, 32 * 32)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (JPEG[:-30], "cut short: no end-of-image marker"),
        (JPEG[: _SOF + 3], "cut inside marker 0xC0"),
        (_edit(JPEG, _SOF, b"\xff\xc3"), "marker 0xC3, which onnxruntime-genai's decoder"),
        (_edit(JPEG, _SOF + 4, b"\x0c"), "12-bit samples; accepted: 8-bit"),
        (_edit(JPEG, _SOF + 9, b"\x04"), "4 components"),
        (_edit(JPEG, _SOF + 5, b"\xff\xff\xff\xff"), "65535 x 65535 pixels, over the"),
        (_edit(_edit(JPEG, _DHT + 5, b"\x02"), _DHT + 8, b"\x0a"), "more codes than its lengths"),
        (JPEG[:2] + JPEG[JPEG.index(b"\xff\xda") :], "image data before the frame header"),
        (JPEG[:2] + b"\xff\xd9", "no image data"),
        (b"GIF89a" + bytes(20), "not a PNG or JPEG image (starts with b'GIF8')"),
        (b"RIFF\x1a\0\0\0WEBPVP8L", "not a PNG or JPEG image (starts with b'RIFF')"),
    ],
    ids=[
        "cut",
        "cut header",
        "lossless",
        "12-bit",
        "cmyk",
        "huge",
        "huffman",
        "scan first",
        "no scan",
        "gif",
        "webp",
    ],
)
def test_what_og_cannot_decode_safely_is_refused_in_words(data, said):
    refusal = image_refusal(data)
    assert refusal is not None and said in refusal and "accepted" in refusal, refusal


def test_a_png_that_declares_too_many_pixels_is_refused():
    side = (int(MAX_PIXELS**0.5) + 1).to_bytes(4, "big")
    huge = PNG[:16] + side + side + PNG[24:]
    assert "over the 67,108,864 accepted; accepted: a smaller image" in image_refusal(huge)


def test_run_refuses_a_cut_jpeg_that_og_would_wait_on_forever(gemma3_bundle, tmp_path, capsys):
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(JPEG[:-30])
    assert main(["run", str(gemma3_bundle), "--image", str(cut), "--prompt", "Hi"]) == 1
    err = capsys.readouterr().err
    assert f"{cut}: a JPEG image onnxruntime-genai cannot decode safely (cut short" in err
    assert "Traceback" not in err


_DECODE = textwrap.dedent(
    """
    import sys, onnxruntime_genai as og
    processor = og.Model(sys.argv[1]).create_multimodal_processor()
    for path in sys.argv[2:]:
        print(path, flush=True)
        try:
            processor("<start_of_image> Hi", images=og.Images.open_bytes(open(path, "rb").read()))
        except RuntimeError:
            pass
    print("done", flush=True)
    """
)


def _mutants(rng: np.random.Generator, count: int) -> list[bytes]:
    """JPEG with bytes changed, flipped, inserted or cut."""
    found = []
    for _ in range(count):
        data = bytearray(JPEG)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(2, len(data)))
            what = int(rng.integers(0, 3))
            if what == 0:
                data[at] ^= 1 << int(rng.integers(0, 8))
            elif what == 1:
                data[at:at] = bytes(rng.integers(0, 256, int(rng.integers(1, 5)), dtype=np.uint8))
            else:
                del data[at:]
                if len(data) < 4:
                    break
        found.append(bytes(data))
    return found


@pytest.mark.slow
def test_damaged_jpegs_that_pass_neither_end_nor_stall_ogs_process(gemma3_bundle, tmp_path):
    """Random damage to a JPEG: og's process decodes (or refuses) every one the check passes,
    within a minute, and goes on (libjpeg ends a process with exit(); a cut stream stalls it)."""
    passed = [m for m in _mutants(np.random.default_rng(7), 400) if image_refusal(m) is None]
    assert 20 < len(passed) < 400
    paths = []
    for index, data in enumerate(passed):
        paths.append(tmp_path / f"{index}.jpg")
        paths[-1].write_bytes(data)
    command = [sys.executable, "-I", "-c", _DECODE, str(gemma3_bundle), *map(str, paths)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-1] == "done", done.stderr[-500:]


def test_the_check_refuses_what_ends_ogs_process(gemma3_bundle, tmp_path):
    """The reason the check exists: og's decoder ends the process on a file that is not PNG
    (libjpeg's exit(): "Not a JPEG file")."""
    broken = tmp_path / "broken.webp"
    broken.write_bytes(b"RIFF\x1a\0\0\0WEBPVP8L" + bytes(20))
    command = [sys.executable, "-I", "-c", _DECODE, str(gemma3_bundle), str(broken)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "done" not in done.stdout
    assert image_refusal(Path(broken).read_bytes()) is not None
