"""Mirror of vllm/v1/worker/gpu_model_runner.py: SchedulerOutput in, sampled tokens out.

Keeps per-request state (InputBatch rows), applies each SchedulerOutput as a delta, packs the scheduled tokens on one
dimension, installs forward_context, runs the model (a hidden state for every scheduled token), picks the
`logits_indices` rows, projects them through lm_head and samples; prompt_logprobs requests need every row and take
them through lm_head chunk by chunk, as vLLM's _get_prompt_logprobs_dict. The Worker builds it over a loaded model
and gives it its KV cache; `last_batch` / `last_attn_metadata` hold a step's packed input. On the CPU the model is
wrapped once, here, in CPUGraphWrapper (compilation/cpu_graph.py, vLLM's CUDAGraphWrapper), which replays decode
batches unless enforce_eager; the runner calls it as it calls any model. With speculative decoding a request's
drafts are packed after its last token, its last d + 1 rows go through lm_head, sampling_step.py verifies them,
and the NgramProposer drafts the next step's (its spec_token_ids). Left out: CUDA graphs, torch.compile, pipeline
parallelism, LoRA, multimodal inputs, async output copies.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.attention import Attention
from minivllm.attention.backends.utils import AttentionMetadata
from minivllm.attention.selector import get_attn_impl
from minivllm.compilation.cpu_graph import CPUGraphWrapper
from minivllm.core.kv_cache_utils import kv_cache_shape
from minivllm.core.sched.output import SchedulerOutput
from minivllm.forward_context import set_forward_context
from minivllm.outputs import DraftTokenIds, ModelRunnerOutput
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metadata import make_spec_decode_metadata
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.utils import mem_utils
from minivllm.utils.math_utils import cdiv
from minivllm.worker.input_batch import InputBatch, PackedBatch
from minivllm.worker.prompt_logprobs import PromptLogprobs
from minivllm.worker.sampling_step import propose_draft_token_ids, sample_tokens
from minivllm.worker.sampling_state import SamplingState


def pack_indices(num_scheduled: np.ndarray, num_computed: np.ndarray, block_table: np.ndarray,
                 num_tokens: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """The step's packed index arithmetic, per request i (int64 arrays [num_reqs]; block_table its rows).

    Request i contributes num_scheduled[i] consecutive rows starting at query_start_loc[i]; their positions
    continue from num_computed[i]. Returns (query_start_loc [num_reqs + 1], req_indices [num_tokens]: the
    request of each row, positions, slot_mapping [num_tokens], sampling: the requests whose step reaches
    their last known token num_tokens[i] (a partial prefill chunk does not sample), logits_indices: each
    sampling request's last row).

    The worked example (the article's): A prefills 4 tokens, B and C decode at positions 50 and 30, with
    block_size 16 and block tables A [3], B [9, 4, 12, 7], C [5, 11].
    """
    # E.g., num_scheduled [4, 1, 1] -> query_start_loc [0, 4, 5, 6]
    query_start_loc = np.concatenate(([0], np.cumsum(num_scheduled)))  # [num_reqs + 1]
    total = int(query_start_loc[-1])
    # E.g., [4, 1, 1] -> req_indices [0, 0, 0, 0, 1, 2]
    req_indices = np.repeat(np.arange(len(num_scheduled)), num_scheduled)  # [num_tokens]
    # E.g., [0, 1, 2, 3, 4, 5] - [0, 0, 0, 0, 4, 5] -> offsets [0, 1, 2, 3, 0, 0]
    offsets = np.arange(total) - query_start_loc[:-1][req_indices]  # [num_tokens]
    # E.g., num_computed [0, 50, 30] -> positions [0, 1, 2, 3, 50, 30]
    positions = num_computed[req_indices] + offsets  # [num_tokens]
    # E.g., logical blocks [0, 0, 0, 0, 3, 1] -> physical [3, 3, 3, 3, 7, 11]
    block_numbers = block_table[req_indices, positions // block_size]  # [num_tokens]
    # E.g., 3*16 + [0, 1, 2, 3], 7*16 + 2, 11*16 + 14 -> slot_mapping [48, 49, 50, 51, 114, 190]
    slot_mapping = block_numbers.astype(np.int64) * block_size + positions % block_size
    # E.g., num_tokens [4, 51, 31]: every request reaches its last token -> sampling [0, 1, 2]
    sampling = np.nonzero(num_computed + num_scheduled >= num_tokens)[0]  # [num_logits]
    # E.g., [4, 5, 6] - 1 -> logits_indices [3, 4, 5]: one row per request goes through lm_head
    logits_indices = query_start_loc[1:][sampling] - 1  # [num_logits]
    return query_start_loc, req_indices, positions, slot_mapping, sampling, logits_indices


class GPUModelRunner:
    def __init__(self, model: torch.nn.Module, *, block_size: int, max_num_reqs: int, max_model_len: int,
                 attention_backend: str, device: str = "cpu", seed: int = 0, num_gpu_blocks: int | None = None,
                 speculative_config: SpeculativeConfig | None = None, enforce_eager: bool = False) -> None:
        """`model` is loaded already (the Worker's load_model); the KV cache comes with initialize_kv_cache,
        once EngineCore has sized it (num_gpu_blocks: allocate it now, for a runner driven by hand)."""
        self.model, self.device, self.block_size = model, torch.device(device), block_size
        self.max_model_len, max_blocks = max_model_len, cdiv(max_model_len, block_size)
        self.attn_layers: dict[str, Attention] = {m.layer_name: m for m in model.modules() if isinstance(m, Attention)}
        self.attn_impl = get_attn_impl(attention_backend)
        self.kv_caches: list[torch.Tensor] = []
        if not enforce_eager:  # vLLM's `self.model = CUDAGraphWrapper(self.model, ...)`, where a replay can serve
            self.model = CPUGraphWrapper.maybe_wrap(model, self.attn_layers, attention_backend, max_num_reqs,
                                                    max_blocks)
        if num_gpu_blocks is not None:
            self.initialize_kv_cache(num_gpu_blocks)
        self.input_batch = InputBatch(max_num_reqs, max_model_len, max_blocks)
        self.vocab_size = model.config.vocab_size
        self.sampling_state = SamplingState(self.vocab_size, self.device, seed)
        self.sampler, self.rejection_sampler = Sampler(), RejectionSampler()
        self.drafter = None if speculative_config is None else NgramProposer(
            speculative_config.num_speculative_tokens, speculative_config.prompt_lookup_min,
            speculative_config.prompt_lookup_max, max_model_len)
        self._draft_token_ids: DraftTokenIds | None = None
        self.prompt_logprobs = PromptLogprobs(self.vocab_size)  # requests still prefilling that want them
        self.last_batch: PackedBatch | None = None  # the last step's packed input, for readers after the step
        self.last_attn_metadata: AttentionMetadata | None = None  # and its attention metadata (tracing, notebooks)

    def get_model(self) -> torch.nn.Module:
        """The model itself, unwrapped (vLLM's get_model)."""
        return self.model.unwrap() if isinstance(self.model, CPUGraphWrapper) else self.model

    def capture_model(self) -> None:
        """vLLM's capture_model, once the KV cache is bound: the CPU graphs' recordings, where the model is wrapped."""
        if isinstance(self.model, CPUGraphWrapper):
            self.model.capture_model()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """vLLM's initialize_kv_cache: allocate every layer's cache and bind it, with the backend, to the layer."""
        self.kv_caches = self._allocate_kv_cache(num_blocks, next(self.model.parameters()).dtype)
        for layer, kv_cache in zip(self.attn_layers.values(), self.kv_caches):
            layer.kv_cache, layer.impl = kv_cache, self.attn_impl

    def _allocate_kv_cache(self, num_blocks: int, dtype: torch.dtype) -> list[torch.Tensor]:
        layer = next(iter(self.attn_layers.values()))
        shape = kv_cache_shape(len(self.attn_layers), num_blocks, self.block_size, layer.num_kv_heads, layer.head_size)
        # zeroed (blocks never written, the null block or a partial block's tail, must not hold NaN), on huge pages
        return list(mem_utils.zeros(shape, dtype, self.device).unbind(0))  # [layers, 2, blocks, block, heads, size]

    def _update_states(self, so: SchedulerOutput) -> None:
        """Apply the scheduler's deltas: drop finished, park preempted, add new, extend cached."""
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            batch.remove_request(req_id)
            self.sampling_state.remove_request(req_id)
            self.prompt_logprobs.remove_request(req_id)
        for req_id in so.preempted_req_ids:
            batch.remove_request(req_id)  # its row is gone; its sampling state stays for the recompute
        for new in so.scheduled_new_reqs:
            params = new.sampling_params
            self.sampling_state.add_request(new.req_id, params, len(new.prompt_token_ids))
            if params.prompt_logprobs is not None:
                self.prompt_logprobs.add_request(new.req_id, params.prompt_logprobs)
            batch.add_request(new.req_id, new.prompt_token_ids, new.block_ids)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.resumed_from_preemption[i]:
                batch.add_request(req_id, cached.resumed_req_token_ids[i], cached.new_block_ids[i])
            else:
                batch.append_block_ids(req_id, cached.new_block_ids[i])
        for req_id, drafts in so.scheduled_spec_decode_tokens.items():  # packed after the last token, not counted
            row = batch.req_id_to_row[req_id]
            batch.token_ids_cpu[row, batch.num_tokens_cpu[row]:batch.num_tokens_cpu[row] + len(drafts)] = drafts

    # Packing: request i contributes num_scheduled_tokens[i] consecutive rows starting at
    # query_start_loc[i]. Every per-token array (input_ids, positions, slot_mapping) is computed
    # for all tokens at once from two gathers: req_indices (row of each token) and positions.
    def _prepare_inputs(self, so: SchedulerOutput) -> PackedBatch:
        batch = self.input_batch
        req_ids = list(so.num_scheduled_tokens)
        num_computed = {n.req_id: n.num_computed_tokens for n in so.scheduled_new_reqs}
        num_computed.update(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        rows = np.array([batch.req_id_to_row[r] for r in req_ids], dtype=np.int64)  # [num_reqs]
        num_scheduled = np.array([so.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)  # [num_reqs]
        computed = np.array([num_computed[r] for r in req_ids], dtype=np.int64)  # [num_reqs]
        # E.g., A prefills 4 tokens, B and C decode at 50 and 30: num_scheduled [4, 1, 1], computed [0, 50, 30]
        query_start_loc, req_indices, positions, slot_mapping, sampling, logits_indices = pack_indices(
            num_scheduled, computed, batch.block_table_cpu[rows], batch.num_tokens_cpu[rows], self.block_size)
        # E.g., positions [0, 1, 2, 3, 50, 30], query_start_loc [0, 4, 5, 6]
        num_tokens = int(query_start_loc[-1])
        # E.g., one gather -> input_ids [A0, A1, A2, A3, B0, C0] (B0: B's token at position 50)
        input_ids = batch.token_ids_cpu[rows[req_indices], positions]  # [num_tokens]
        # E.g., [0, 50, 30] + [4, 1, 1] -> seq_lens [4, 51, 31]
        seq_lens = computed + num_scheduled  # [num_reqs]
        max_blocks = cdiv(int(seq_lens.max()), self.block_size)
        block_table = batch.block_table_cpu[rows, :max_blocks]  # [num_reqs, max_blocks]
        sampling_ids = [req_ids[i] for i in sampling]
        drafts = [so.scheduled_spec_decode_tokens.get(r, []) for r in sampling_ids]
        spec = make_spec_decode_metadata(query_start_loc[1:][sampling], drafts) if any(drafts) else None
        logits_indices = logits_indices if spec is None else spec.logits_indices
        dev = self.device
        return PackedBatch(
            req_ids=req_ids, num_reqs=len(req_ids), num_scheduled_tokens=num_scheduled, num_tokens=num_tokens,
            query_start_loc=torch.from_numpy(query_start_loc.astype(np.int32)).to(dev),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
            input_ids=torch.from_numpy(input_ids).to(dev), positions=torch.from_numpy(positions).to(dev),
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            block_table=torch.from_numpy(np.ascontiguousarray(block_table)).to(dev),
            logits_indices=torch.from_numpy(logits_indices).to(dev), sampling_req_indices=sampling.tolist(),
            num_computed_tokens=computed, spec_decode_metadata=spec)

    def _attn_metadata(self, b: PackedBatch) -> AttentionMetadata:
        qsl, seq_lens = b.query_start_loc.tolist(), b.seq_lens.tolist()
        return AttentionMetadata(
            num_actual_tokens=b.num_tokens, max_query_len=int(b.num_scheduled_tokens.max()),
            query_start_loc=b.query_start_loc, max_seq_len=max(seq_lens), seq_lens=b.seq_lens,
            block_table=b.block_table, slot_mapping=b.slot_mapping, query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)

    def _get_prompt_logprobs_dict(self, b: PackedBatch, hidden_states: torch.Tensor) -> dict[str, list]:
        """The prompt logprobs of the requests whose prefill ended this step (worker/prompt_logprobs.py)."""
        return self.prompt_logprobs.compute(b, hidden_states, self.model, self.input_batch,
                                            self.sampling_state.num_prompt_tokens)

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        self.last_batch = self.last_attn_metadata = None
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput([], {}, [])
        b = self.last_batch = self._prepare_inputs(so)
        attn_metadata = self.last_attn_metadata = self._attn_metadata(b)
        with set_forward_context(attn_metadata, self.attn_layers, b.slot_mapping):
            hidden_states = self.model(b.input_ids, b.positions)  # [num_tokens, hidden_size]
        prompt_logprobs = self._get_prompt_logprobs_dict(b, hidden_states) if self.prompt_logprobs else {}
        sampling_ids = [b.req_ids[i] for i in b.sampling_req_indices]
        logits = self.model.compute_logits(hidden_states[b.logits_indices])  # [num_logits, vocab]
        outputs, sampled_logprobs = sample_tokens(self.sampler, self.rejection_sampler, self.sampling_state,
                                                  self.input_batch, logits, sampling_ids, b.spec_decode_metadata) \
            if sampling_ids else ([], None)
        sampled_token_ids: list[list[int]] = [[] for _ in b.req_ids]
        logprobs: list | None = None if sampled_logprobs is None else [None] * b.num_reqs
        for j, (req_index, req_id, tokens) in enumerate(zip(b.sampling_req_indices, sampling_ids, outputs)):
            sampled_token_ids[req_index] = tokens
            for token in tokens:
                self.input_batch.append_token(req_id, token)
            if logprobs is not None:
                logprobs[req_index] = sampled_logprobs[j]
        if self.drafter is not None:  # taken by take_draft_token_ids after the step, as vLLM's
            proposed = propose_draft_token_ids(self.drafter, self.sampling_state, self.input_batch, sampling_ids,
                                               so.num_spec_tokens_to_schedule)
            self._draft_token_ids = DraftTokenIds(list(proposed), list(proposed.values()))
        return ModelRunnerOutput(b.req_ids, {r: i for i, r in enumerate(b.req_ids)}, sampled_token_ids, logprobs,
                                 prompt_logprobs)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed in the last step (once: they are cleared)."""
        drafts, self._draft_token_ids = self._draft_token_ids, None
        return drafts
