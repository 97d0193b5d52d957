"""The smoke test's 3-D mrope positions against transformers' get_rope_index."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mobius_genai.runtime.mrope import mrope_positions
from tests._qwen_vl import IMAGE_TOKEN, VISION_END, VISION_START, tiny_qwen2_5_vl, token_types


@pytest.mark.parametrize("grids", [[[1, 8, 12]], [[1, 4, 4], [1, 10, 6]], [[2, 4, 8]]])
def test_positions_equal_transformers_rope_index(grids):
    ids = [5, 6]
    for t, h, w in grids:
        ids += [VISION_START, *[IMAGE_TOKEN] * (t * h * w // 4), VISION_END, 7, 8]
    ids += [9]
    grid = np.array(grids, np.int64)
    model = tiny_qwen2_5_vl()
    input_ids = torch.tensor([ids])
    expected, _ = model.model.get_rope_index(
        input_ids, token_types(input_ids), image_grid_thw=torch.from_numpy(grid)
    )
    found = mrope_positions(
        ids, grid, image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START, merge=2
    )
    np.testing.assert_array_equal(found, expected.numpy())
