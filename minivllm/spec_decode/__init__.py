"""Speculative decoding (vllm/v1/spec_decode/): n-gram prompt lookup proposes, the target model verifies."""
