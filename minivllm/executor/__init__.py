"""Mirror of vllm/v1/executor/: what EngineCore calls to run the model, on one worker or several."""
from minivllm.executor.abstract import Executor

__all__ = ["Executor"]
