"""minivllm: a compact, runnable mirror of vLLM's V1 engine, for reading beside the article."""
from minivllm.entrypoints.llm import LLM
from minivllm.outputs import CompletionOutput, RequestOutput
from minivllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
