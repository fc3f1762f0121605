"""Where the GPU checks run (tests/gpu/run.sh runs them on a CUDA machine; without one they are skipped).

MINIVLLM_GPU_TEST_DEVICE=cpu (with TRITON_INTERPRET=1) runs the small cases on the CPU, to check the tests
themselves before a GPU is lent.
"""
from __future__ import annotations

import os

import pytest
import torch

DEVICE = os.environ.get("MINIVLLM_GPU_TEST_DEVICE", "cuda")
ON_GPU = DEVICE == "cuda"
if ON_GPU and torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, even if a CPU test module is imported beside us

skip_without_device = pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(),
                                         reason="no CUDA device: run tests/gpu/run.sh on a GPU machine")
gpu_only = pytest.mark.skipif(not (ON_GPU and torch.cuda.is_available()),
                              reason="large shapes: too slow for Triton's CPU interpreter")


