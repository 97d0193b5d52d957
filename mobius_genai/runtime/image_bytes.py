"""An image's bytes checked before onnxruntime-genai's processor decodes them.

og 0.18's processor decodes images with onnxruntime-extensions: PNG through libpng, whose
errors become exceptions, and everything else through libjpeg, whose fatal errors end the
whole process (its default error handler calls exit(): "Not a JPEG file", "Unsupported marker
type"). `run --image` would stop with a line of libjpeg's; `serve` would stop for every client.
So an image reaches og only as PNG or as a JPEG whose marker structure passes the checks
libjpeg makes fatal (segment lengths, frame and scan headers, table definitions, the tables a
scan uses, progressive parameters); damaged entropy-coded data is only a warning to libjpeg.
WebP and the other formats, which og 0.18 does not decode, are refused by their signature.
Both formats are also held to `MAX_PIXELS`: a small file may declare a huge image.
"""

from __future__ import annotations

from collections.abc import Callable

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
#: The image formats og 0.18's processor decodes, by their signature.
FORMATS = {"PNG": PNG_SIGNATURE, "JPEG": JPEG_SIGNATURE}
#: Images larger than this many pixels are refused (192 MiB of RGB once decoded); `serve`
#: holds the images of one request to it together.
MAX_PIXELS = 1 << 26
#: Accepted, in refusals.
ACCEPTED = "a PNG or JPEG image, the formats onnxruntime-genai's processor decodes"

_SOF = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_DHT, _DQT, _DRI, _SOS, _EOI = 0xC4, 0xDB, 0xDD, 0xDA, 0xD9
_SKIPPED = {*range(0xE0, 0xF0), 0xFE}  # APPn, COM
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RSTn
_MAX_BLOCKS_IN_MCU = 10  # libjpeg's D_MAX_BLOCKS_IN_MCU


class _Bad(Exception):
    """What is wrong with a JPEG's structure, in words."""


def image_refusal(data: bytes) -> str | None:
    """What keeps og from decoding `data` safely, in words; None for a PNG or a JPEG og may
    be given."""
    if data.startswith(PNG_SIGNATURE):
        return _png_refusal(data)
    if data.startswith(JPEG_SIGNATURE):
        try:
            _check_jpeg(data)
        except _Bad as bad:
            return (
                f"a JPEG image onnxruntime-genai cannot decode safely ({bad}); accepted: {ACCEPTED}"
            )
        return None
    return f"not a PNG or JPEG image (starts with {data[:4]!r}); accepted: {ACCEPTED}"


def image_pixels(data: bytes) -> int:
    """The pixels an image `image_refusal` passed declares (its width times its height)."""
    if data.startswith(PNG_SIGNATURE):
        return _png_size(data)[0] * _png_size(data)[1]
    return _check_jpeg(data).pixels


def _png_size(data: bytes) -> tuple[int, int]:
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _png_refusal(data: bytes) -> str | None:
    """libpng reports a damaged PNG as an error og raises; only its size is checked here."""
    if len(data) < 24 or data[12:16] != b"IHDR":
        return f"a damaged PNG image (no IHDR chunk first); accepted: {ACCEPTED}"
    width, height = _png_size(data)
    refused = _size_refusal(width, height)
    return None if refused is None else f"a PNG image of {refused}; accepted: a smaller image"


def _size_refusal(width: int, height: int) -> str | None:
    if width * height > MAX_PIXELS:
        return f"{width} x {height} pixels, over the {MAX_PIXELS:,} accepted"
    return None


class _Jpeg:
    """What the markers read so far define: the frame's components and the tables."""

    def __init__(self) -> None:
        self.components: dict[int, tuple[int, int, int]] = {}  # id -> (h, v, quant table)
        self.progressive = False
        self.tables: set[tuple[str, int]] = set()  # ("q", n), ("dc", n), ("ac", n)
        self.scans = 0
        self.ended = False
        self.pixels = 0


def _check_jpeg(data: bytes) -> _Jpeg:
    """What the markers define; _Bad unless every marker up to the image data's end is one
    libjpeg reads without a fatal error."""
    jpeg, pos = _Jpeg(), 2
    while pos < len(data):
        if data[pos] != 0xFF:
            raise _Bad(f"no marker at byte {pos}")
        while pos < len(data) and data[pos] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos >= len(data):
            break
        marker, pos = data[pos], pos + 1
        if marker == _EOI:
            jpeg.ended = True
            break
        if marker in _STANDALONE:
            continue
        if pos + 2 > len(data):
            raise _Bad(f"cut inside marker 0x{marker:02X}")
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2 or pos + length > len(data):
            raise _Bad(f"marker 0x{marker:02X} has a length of {length} bytes that the file lacks")
        segment, pos = data[pos + 2 : pos + length], pos + length
        read = _READERS.get(marker)
        if read is None and marker not in _SKIPPED:
            raise _Bad(f"marker 0x{marker:02X}, which onnxruntime-genai's decoder does not read")
        if read is not None:
            read(jpeg, segment, marker)
        if marker == _SOS:
            pos = _after_scan(data, pos)
    if jpeg.scans == 0:
        raise _Bad("no image data")
    if not jpeg.ended:  # onnxruntime-extensions then waits for more data forever
        raise _Bad("cut short: no end-of-image marker")
    return jpeg


def _after_scan(data: bytes, pos: int) -> int:
    """The position of the first marker after the entropy-coded data at `pos` (stuffed 0xFF
    0x00 bytes and restart markers belong to the data)."""
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= len(data):
            return len(data)
        following = data[pos + 1]
        if following != 0 and not 0xD0 <= following <= 0xD7:
            return pos
        pos += 2


def _frame(jpeg: _Jpeg, segment: bytes, marker: int) -> None:
    if jpeg.components:
        raise _Bad("a second frame header")
    if len(segment) < 6:
        raise _Bad("a frame header cut short")
    precision, count = segment[0], segment[5]
    height, width = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big")
    if precision != 8:
        raise _Bad(f"{precision}-bit samples; accepted: 8-bit")
    if not height or not width or count not in (1, 3) or len(segment) != 6 + 3 * count:
        raise _Bad(f"a frame header of {width} x {height} pixels, {count} components")
    refused = _size_refusal(width, height)
    if refused is not None:
        raise _Bad(refused)
    jpeg.pixels = width * height
    for i in range(count):
        ident, sampling, table = segment[6 + 3 * i : 9 + 3 * i]
        h, v = sampling >> 4, sampling & 15
        if not (1 <= h <= 4 and 1 <= v <= 4 and table <= 3) or ident in jpeg.components:
            raise _Bad(f"component {ident}'s sampling or table is out of range")
        jpeg.components[ident] = (h, v, table)
    h_max = max(h for h, _, _ in jpeg.components.values())
    v_max = max(v for _, v, _ in jpeg.components.values())
    if any(h_max % h or v_max % v for h, v, _ in jpeg.components.values()):
        raise _Bad("fractional sampling factors")
    jpeg.progressive = marker == 0xC2


def _quant_tables(jpeg: _Jpeg, segment: bytes, marker: int) -> None:
    pos = 0
    while pos < len(segment):
        precision, table = segment[pos] >> 4, segment[pos] & 15
        size = 64 * (precision + 1)
        if precision > 1 or table > 3 or pos + 1 + size > len(segment):
            raise _Bad("a damaged quantization table")
        jpeg.tables.add(("q", table))
        pos += 1 + size


def _huffman_tables(jpeg: _Jpeg, segment: bytes, marker: int) -> None:
    pos = 0
    while pos < len(segment):
        kind, table = segment[pos] >> 4, segment[pos] & 15
        counts = segment[pos + 1 : pos + 17]
        total = sum(counts)
        symbols = segment[pos + 17 : pos + 17 + total]
        if kind > 1 or table > 3 or len(counts) < 16 or total > 256 or len(symbols) < total:
            raise _Bad("a damaged Huffman table")
        code = 0
        for length, count in enumerate(counts, start=1):  # libjpeg's canonical-code check
            code += count
            if code >= 1 << length:
                raise _Bad("a Huffman table with more codes than its lengths allow")
            code <<= 1
        if kind == 0 and any(symbol > 15 for symbol in symbols):
            raise _Bad("a DC Huffman table with a category over 15")
        jpeg.tables.add(("ac" if kind else "dc", table))
        pos += 17 + total


def _restart_interval(jpeg: _Jpeg, segment: bytes, marker: int) -> None:
    if len(segment) != 2:
        raise _Bad("a damaged restart interval")


def _scan(jpeg: _Jpeg, segment: bytes, marker: int) -> None:
    if not jpeg.components:
        raise _Bad("image data before the frame header")
    count = segment[0] if segment else 0
    if not 1 <= count <= 4 or len(segment) != 4 + 2 * count:
        raise _Bad("a damaged scan header")
    start, end, approximation = segment[-3:]
    high, low = approximation >> 4, approximation & 15
    dc_scan = start == 0
    blocks = 0
    for i in range(count):
        ident, tables = segment[1 + 2 * i : 3 + 2 * i]
        if ident not in jpeg.components:
            raise _Bad(f"a scan of component {ident}, which the frame lacks")
        h, v, quant = jpeg.components[ident]
        blocks += h * v
        needed = [("q", quant)]
        if not jpeg.progressive or (dc_scan and high == 0):
            needed.append(("dc", tables >> 4))
        if not jpeg.progressive or not dc_scan:
            needed.append(("ac", tables & 15))
        missing = [f"{kind} table {n}" for kind, n in needed if (kind, n) not in jpeg.tables]
        if missing:
            raise _Bad(f"a scan using the undefined {', '.join(missing)}")
    if count > 1 and blocks > _MAX_BLOCKS_IN_MCU:
        raise _Bad("too many blocks in a scan's unit")
    if jpeg.progressive and (
        (dc_scan and end != 0)
        or (not dc_scan and (start > end or end > 63 or count != 1))
        or (high and low != high - 1)
        or low > 13
    ):
        raise _Bad("invalid progressive scan parameters")
    jpeg.scans += 1


_READERS: dict[int, Callable[[_Jpeg, bytes, int], None]] = {
    **dict.fromkeys(_SOF, _frame),
    _DQT: _quant_tables,
    _DHT: _huffman_tables,
    _DRI: _restart_interval,
    _SOS: _scan,
}
