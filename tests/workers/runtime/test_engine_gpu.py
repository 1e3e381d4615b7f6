"""GPU placements (skipped without CUDA): the 1-GPU pipeline runs the tiny preset end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.engine import assert_idle, run_session
from workers.runtime.engine import PipelineEngine
from workers.runtime.placement import PLACEMENTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_one_gpu_pipeline_streams_frames() -> None:
    with PipelineEngine("tiny", PLACEMENTS["1gpu"], "pipelined") as engine:
        frames = run_session(engine, seed=5, num_chunks=3)
        assert_idle(engine)
    assert [len(f) for f in frames] == [13, 16, 16]
    assert all(f.dtype == np.uint8 and f.shape[1:] == (128, 128, 3) for f in frames)
