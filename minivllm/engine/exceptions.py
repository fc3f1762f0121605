"""Mirror of vllm/v1/engine/exceptions.py: the error a caller gets once the engine cannot go on."""
from __future__ import annotations


class EngineDeadError(RuntimeError):
    """EngineCore, or one of its worker processes, died; the engine cannot continue."""
