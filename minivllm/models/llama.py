"""Mirror of vllm/model_executor/models/llama.py: Llama over packed tokens.

`forward(input_ids, positions)` takes the flat [num_tokens] batch; attention
metadata arrives through forward_context, never through this signature. As vLLM's,
`inputs_embeds` may stand in for input_ids (`get_input_embeddings` makes them): the
CPU graphs (minivllm/compilation/cpu_graph.py) look up the embeddings before the replay.
q/k/v and gate/up are fused into one matmul each; `load_weights` hands each of HF's
separate tensors to its fused parameter's weight_loader, which keeps this rank's slice.
Under tensor parallelism each worker builds the same model with its shard of every layer
(linear.py, vocab_parallel_embedding.py): its own query and KV heads, its own slice of the
MLP, two all-reduces per layer. The forward returns a hidden state for every scheduled token;
`compute_logits` runs lm_head only on the rows the runner selected with logits_indices.
Left out: pipeline parallelism, LoRA, quantization.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from minivllm.attention import Attention
from minivllm.models.layers import RMSNorm, RotaryEmbedding, SiluAndMul
from minivllm.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, \
    default_weight_loader
from minivllm.models.logits_processor import LogitsProcessor
from minivllm.models.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


def rope_parameters(config) -> dict:
    rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope


class LlamaAttention(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        total_num_heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // total_num_heads
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_num_heads,
                                          config.num_key_value_heads, bias=bias, prefix=f"{prefix}.qkv_proj")
        # this rank's heads: all of them with tensor_parallel_size 1
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(total_num_heads * self.head_dim, config.hidden_size, bias=bias,
                                        prefix=f"{prefix}.o_proj")
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads,
                              layer_name=f"{prefix}.attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q.view(-1, self.num_heads, self.head_dim),
                               k.view(-1, self.num_kv_heads, self.head_dim))
        attn_output = self.attn(q, k, v)  # every row's K/V is in the cache now
        output, _ = self.o_proj(attn_output)  # [num_tokens, hidden_size], summed over the ranks
        return output


class LlamaMLP(nn.Module):
    def __init__(self, config, prefix: str) -> None:
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2,
                                                       bias=bias, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=bias,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)  # [num_tokens, 2 * intermediate_size / tp]
        x, _ = self.down_proj(self.act_fn(gate_up))  # [num_tokens, hidden_size], summed over the ranks
        return x


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, rotary_emb: RotaryEmbedding, prefix: str) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary_emb, prefix=f"{prefix}.self_attn")
        self.mlp = LlamaMLP(config, prefix=f"{prefix}.mlp")
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
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, prefix="model.embed_tokens")
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, rotary_emb, prefix=f"model.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        # [num_tokens, hidden_size]; inputs_embeds given (a replayed CPU graph's input): the lookup ran already
        hidden_states = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        return self.norm(hidden_states, residual)[0]  # [num_tokens, hidden_size]


class LlamaForCausalLM(nn.Module):
    # (our fused parameter, the HF checkpoint's name, its shard), vLLM's order
    stacked_params_mapping = [(".qkv_proj.", ".q_proj.", "q"), (".qkv_proj.", ".k_proj.", "k"),
                              (".qkv_proj.", ".v_proj.", "v"), (".gate_up_proj.", ".gate_proj.", 0),
                              (".gate_up_proj.", ".up_proj.", 1)]

    def __init__(self, config, max_model_len: int) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, max_model_len)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix="lm_head")
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids, positions, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)  # [num_logits, vocab_size], on every rank

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked(self, weights, self.stacked_params_mapping, skip=("rotary_emb.inv_freq",))


def load_stacked(model: nn.Module, weights, mapping, skip=()) -> None:
    """Hand each HF tensor to its parameter's weight_loader, which copies in this rank's slice; a tensor
    named in `mapping` ((fused parameter, checkpoint name, shard)) goes to its shard of the fused one."""
    params = dict(model.named_parameters())  # a tied lm_head's weight is the embedding's: listed once
    tied = getattr(model.config, "tie_word_embeddings", False)
    loaded: dict[str, set] = {}
    for name, tensor in weights:
        if any(s in name for s in skip):
            continue
        target, shard_id = name, None
        for param_name, weight_name, shard in mapping:
            if weight_name in name:
                target, shard_id = name.replace(weight_name, param_name), shard
                break
        if target not in params:
            if name == "lm_head.weight" and tied:
                continue
            raise ValueError(f"checkpoint tensor {name!r} has no counterpart in {type(model).__name__}")
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        try:
            if shard_id is None:
                (loader or default_weight_loader)(param, tensor)
            else:
                loader(param, tensor, shard_id)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
        loaded.setdefault(target, set()).add(shard_id)
    missing = sorted(set(params) - set(loaded))
    for target, shards in loaded.items():  # a fused parameter needs every one of its parts
        wanted = {shard for param_name, _, shard in mapping if param_name in target}
        if None not in shards and shards != wanted:
            missing.append(f"{target} (shards {sorted(map(str, wanted - shards))})")
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {missing[:5]}")
