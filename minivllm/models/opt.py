"""Mirror of vllm/model_executor/models/opt.py: OPT (the article's facebook/opt-125m) over packed tokens.

Learned positions are offset by 2 as in the original checkpoints; the forward
takes `(input_ids, positions)` only, like every minivllm model. Under tensor
parallelism each rank holds its heads and its slice of fc1/fc2 (linear.py); the
learned positions and project_in/out are replicated, as in vLLM. Left out: quantization.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.attention import Attention
from minivllm.models.linear import ColumnParallelLinear, QKVParallelLinear, ReplicatedLinear, RowParallelLinear
from minivllm.models.llama import load_stacked
from minivllm.models.logits_processor import LogitsProcessor
from minivllm.models.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


class OPTAttention(nn.Module):
    def __init__(self, config, prefix: str) -> None:
        super().__init__()
        total_num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // total_num_heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_num_heads, total_num_heads,
                                          bias=bias, prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads  # this rank's
        self.out_proj = RowParallelLinear(config.hidden_size, config.hidden_size, bias=bias,
                                          prefix=f"{prefix}.out_proj")
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_heads,
                              layer_name=f"{prefix}.attn")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.chunk(3, dim=-1)  # each [num_tokens, hidden_size / tp]
        output, _ = self.out_proj(self.attn(q, k, v))  # summed over the ranks
        return output


class OPTDecoderLayer(nn.Module):
    def __init__(self, config, prefix: str) -> None:
        super().__init__()
        bias = getattr(config, "enable_bias", True)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.do_layer_norm_before = config.do_layer_norm_before
        self.self_attn = OPTAttention(config, prefix=f"{prefix}.self_attn")
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(config.hidden_size, config.ffn_dim, bias=bias, prefix=f"{prefix}.fc1")
        self.fc2 = RowParallelLinear(config.ffn_dim, config.hidden_size, bias=bias, prefix=f"{prefix}.fc2")
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.act = _ACTIVATIONS[config.activation_function]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        pre = self.do_layer_norm_before
        residual = hidden_states
        x = self.self_attn(self.self_attn_layer_norm(hidden_states) if pre else hidden_states)
        hidden_states = residual + x
        if not pre:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        residual = hidden_states
        x, _ = self.fc1(self.final_layer_norm(hidden_states) if pre else hidden_states)
        x, _ = self.fc2(self.act(x))
        hidden_states = residual + x
        return hidden_states if pre else self.final_layer_norm(hidden_states)


class OPTDecoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.word_embed_proj_dim,
                                                   prefix="model.decoder.embed_tokens")
        self.embed_positions = nn.Embedding(config.max_position_embeddings + 2, config.hidden_size)
        proj = config.word_embed_proj_dim != config.hidden_size
        self.project_in = ReplicatedLinear(config.word_embed_proj_dim, config.hidden_size, bias=False) if proj else None
        self.project_out = ReplicatedLinear(config.hidden_size, config.word_embed_proj_dim, bias=False) if proj else None
        final_norm = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size) if final_norm else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config, prefix=f"model.decoder.layers.{i}")
                                    for i in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [num_tokens, word_embed_proj_dim]
        if self.project_in is not None:
            x, _ = self.project_in(x)
        x = x + self.embed_positions(positions + 2)  # OPT's learned positions start at offset 2
        for layer in self.layers:
            x = layer(x)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        return self.project_out(x)[0] if self.project_out is not None else x


class OPTModel(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    stacked_params_mapping = [(".qkv_proj.", ".q_proj.", "q"), (".qkv_proj.", ".k_proj.", "k"),
                              (".qkv_proj.", ".v_proj.", "v")]

    def __init__(self, config, max_model_len: int) -> None:
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.word_embed_proj_dim, prefix="lm_head")
        if getattr(config, "tie_word_embeddings", True):
            self.lm_head.tie_weights(self.model.decoder.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)  # [num_logits, vocab_size], on every rank

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Some OPT checkpoints name tensors "decoder.*" without the "model." prefix.
        weights = ((n if n.startswith(("model.", "lm_head.")) else f"model.{n}", t) for n, t in weights)
        load_stacked(self, weights, self.stacked_params_mapping)
