"""Mirror of vllm/model_executor/models/llama.py: Llama over packed tokens.

`forward(input_ids, positions)` takes the flat [num_tokens] batch; attention
metadata arrives through forward_context, never through this signature.
q/k/v and gate/up are fused into one matmul each; `load_weights` maps HF's
separate tensors onto them. `compute_logits` runs lm_head only on the rows the
runner selected with logits_indices. Left out: tensor parallelism, LoRA, quantization.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minivllm.attention import Attention
from minivllm.models.layers import RMSNorm, RotaryEmbedding, SiluAndMul


def rope_parameters(config) -> dict:
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


class LlamaAttention(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=bias)
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                              layer_name=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q.view(-1, self.num_heads, self.head_dim),
                               k.view(-1, self.num_kv_heads, self.head_dim))
        return self.o_proj(self.attn(q, k, v))  # [num_tokens, hidden_size]


class LlamaMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [num_tokens, hidden_size]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream is carried beside the hidden states; each norm adds the previous
        # sublayer's output into it (x + f(norm(x)) per sublayer, as in HF, with the add fused).
        if residual is None:
            hidden_states, residual = self.input_layernorm(hidden_states), hidden_states
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config, max_model_len: int) -> None:
        super().__init__()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rotary_emb = RotaryEmbedding(head_dim, max(max_model_len, 1), rope_parameters(config))
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary_emb, prefix=f"model.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None  # [num_tokens, hidden_size]
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        return self.norm(hidden_states, residual)[0]


class LlamaForCausalLM(nn.Module):
    # HF checkpoint name -> (our fused parameter, shard index)
    stacked_params_mapping = [(".q_proj.", ".qkv_proj.", 0), (".k_proj.", ".qkv_proj.", 1),
                              (".v_proj.", ".qkv_proj.", 2), (".gate_proj.", ".gate_up_proj.", 0),
                              (".up_proj.", ".gate_up_proj.", 1)]

    def __init__(self, config, max_model_len: int) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, max_model_len)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)  # [num_logits, vocab_size]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked(self, weights, self.stacked_params_mapping, skip=("rotary_emb.inv_freq",))


def load_stacked(model: nn.Module, weights, mapping, skip=()) -> None:
    """Copy HF tensors into our parameters, concatenating fused ones shard by shard in order."""
    params = dict(model.named_parameters())
    pending: dict[str, dict[int, torch.Tensor]] = {}
    loaded = set()
    for name, tensor in weights:
        if any(s in name for s in skip):
            continue
        for old, new, shard in mapping:
            if old in name:
                fused = name.replace(old, new)
                pending.setdefault(fused, {})[shard] = tensor
                break
        else:
            if name not in params:
                if name == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False):
                    continue
                raise ValueError(f"checkpoint tensor {name!r} has no counterpart in {type(model).__name__}")
            _copy(params[name], tensor, name)
            loaded.add(name)
    for fused, shards in pending.items():
        _copy(params[fused], torch.cat([shards[i] for i in sorted(shards)], dim=0), fused)
        loaded.add(fused)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = set(params) - loaded - tied
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {sorted(missing)[:5]}")


def _copy(param: nn.Parameter, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(f"shape mismatch for {name}: model {tuple(param.shape)}, checkpoint {tuple(tensor.shape)}")
    with torch.no_grad():
        param.copy_(tensor)
