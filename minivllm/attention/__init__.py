from minivllm.attention.layer import Attention

__all__ = ["Attention"]
