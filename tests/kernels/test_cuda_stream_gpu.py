"""``kernels.cuda.torch_stream``: CuPy launches on torch's current stream, a side stream included,
through ``Stream.from_external`` where CuPy has it (``ExternalStream`` is deprecated in CuPy 14)."""

from __future__ import annotations

import warnings

import pytest
import torch

from metrale_core.kernels import cupy_unavailable_reason
from metrale_core.kernels.cuda import _StreamHandle, torch_stream


def test_the_handle_speaks_the_cuda_stream_protocol():
    assert _StreamHandle(0x1234).__cuda_stream__() == (0, 0x1234)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.skipif(cupy_unavailable_reason() is not None, reason=str(cupy_unavailable_reason()))
def test_cupy_runs_on_torchs_current_stream_without_deprecation_warnings():
    import cupy

    device = torch.device("cuda")
    side = torch.cuda.Stream()
    with warnings.catch_warnings(), torch.cuda.stream(side):
        warnings.simplefilter("error", DeprecationWarning)
        with torch_stream(device):
            assert cupy.cuda.get_current_stream().ptr == side.cuda_stream
