"""3-D mrope positions of a prompt with images (Qwen2.5-VL), for the smoke test's reference
loop: transformers' `get_rope_index` for images, written from its definition rather than from
onnxruntime-genai's, so the two can disagree.

Text tokens count up on all three axes; the k-th image (its run of image tokens after a
vision-start token, grid (t, h, w) patches) places its merged tokens at (start + t_i,
start + row, start + column); the text after it resumes at start + max(h, w) / merge.
Generated tokens then continue one by one from the prompt's largest position + 1.
"""

from __future__ import annotations

import numpy as np


def mrope_positions(
    input_ids: list[int],
    grids: np.ndarray,
    *,
    image_token_id: int,
    vision_start_token_id: int,
    merge: int,
) -> np.ndarray:
    """position_ids [3, 1, seq] int64 of one prompt; `grids` [images, 3] (t, h, w)."""
    columns: list[np.ndarray] = []
    start, index, images = 0, 0, iter(np.asarray(grids).reshape(-1, 3).tolist())
    while index < len(input_ids):
        is_image = (
            input_ids[index] == image_token_id
            and index > 0
            and input_ids[index - 1] == vision_start_token_id
        )
        if not is_image:
            columns.append(np.full((3, 1), start))
            start, index = start + 1, index + 1
            continue
        frames, height, width = next(images)
        rows, cols = height // merge, width // merge
        t, h, w = np.meshgrid(np.arange(frames), np.arange(rows), np.arange(cols), indexing="ij")
        columns.append(np.stack([t.ravel(), h.ravel(), w.ravel()]) + start)
        start, index = start + max(rows, cols), index + frames * rows * cols
    return np.concatenate(columns, axis=1)[:, None, :].astype(np.int64)
