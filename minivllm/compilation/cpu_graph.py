"""Mirror of vllm/compilation/cuda_graph.py (CUDAGraphWrapper), for the CPU: a decode step replayed as recorded C calls.

On a GPU, vLLM captures the forward of a decode batch as a CUDA graph and replays it: one launch instead of
hundreds, no Python between the kernels. A CPU has no graphs, but minivllm's forward on the CPU is, op for op,
calls into its compiled library (minivllm/_C.py) wrapped in Python: the module calls, checks and allocations
around them are a large share of a small decode step.
CPUGraphWrapper records those C calls in a forward and replays them: the same kernels with the same arguments,
so the output is bit for bit the eager one.

What a replay needs, and how it is kept, as for CUDA graphs:
- Fixed input addresses: the step's inputs are copied into persistent buffers (`inputs_embeds`, `positions`,
  the attention metadata) before the forward, at capture and at every replay.
- Fixed intermediates: every tensor the forward allocates is seen (a TorchDispatchMode) and given a place in
  one arena, two tensors sharing bytes only where their lifetimes (first to last call using them) do not
  meet. The output is a view into the arena, valid until the next replay.
- Nothing else: the capture is refused (every step then runs eagerly, logged once) when the forward runs a
  torch op that computes (a norm in PyTorch, oneDNN's GEMM past the C kernel's rows, an all-reduce) or hands
  C a pointer into memory that is neither the arena's nor kept for good (weights, KV caches, the buffers).

As vLLM's FULL_DECODE_ONLY mode, only uniform decode batches run as graphs (every request one token, no drafts),
captured at start-up (`capture_model`) after the KV cache is allocated. Where vLLM captures a graph per size in a
list and pads a batch up to the next (a padded row costs a CPU its full arithmetic), minivllm records the forward
twice (its C calls written down, not run: a capture does no arithmetic), at the largest size and at two requests,
and keeps one template: the arguments that differ between the two are exactly the row count, set at each replay, so
every size 1..max runs unpadded (as torch.compile's one graph with a symbolic num_tokens). Every other scalar a C
op takes is frozen at capture, as a CUDA graph's kernel arguments are: a kernel must read what changes from step to
step (positions, sequence lengths, block tables, slots) from tensors, as all of minivllm's do. The graph covers the
decoder layers and the final norm; the embedding (a torch gather) runs before it, vLLM's `inputs_embeds` path.
`enforce_eager=True` turns it off.

As vLLM's wrapper, it wraps the model once, when the runner is built, and is called exactly like the model:
`model(input_ids, positions)` inside the runner's forward context. It reads the step's attention metadata from
that context and decides per call whether to replay (a uniform decode batch of a size the template serves) or
to run the wrapped model eagerly; other attributes (compute_logits, parameters, config) are the model's.
"""
from __future__ import annotations

import logging

import torch

from minivllm import _C
from minivllm import _custom_ops as ops
from minivllm.attention.backends.utils import AttentionMetadata
from minivllm.compilation.recorder import ROWS, At, CaptureRefused, Recording, Template, Trace, Watch, \
    derive_template, regions, tensors_kept
from minivllm.distributed.parallel_state import get_tp_group
from minivllm.forward_context import get_forward_context, set_forward_context
from minivllm.models.utils import small_batch_rows

logger = logging.getLogger("minivllm")


class CPUGraphWrapper:
    """The model, with its forward for uniform decode batches of 1..max_batch_size requests served by replaying
    the template `capture_model` recorded; `num_replays` counts the steps it served."""

    def __init__(self, model: torch.nn.Module, attn_layers: dict, max_batch_size: int, max_num_blocks_per_req: int):
        self.runnable, self.attn_layers, self.max_batch_size = model, attn_layers, max_batch_size
        n, dtype = max_batch_size, next(model.parameters()).dtype
        # The persistent inputs (vLLM's runner keeps the same ones); a step's are copied in before its forward.
        self.inputs_embeds = torch.zeros(n, model.config.hidden_size, dtype=dtype)
        self.positions = torch.zeros(n, dtype=torch.int64)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64)
        self.seq_lens = torch.ones(n, dtype=torch.int32)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32)  # a decode batch: request i is row i
        self.block_table = torch.zeros(n, max_num_blocks_per_req, dtype=torch.int32)
        self.template: Template | None = None
        self.arena = torch.empty(0, dtype=torch.uint8)
        self._calls: list = []  # (function, ctypes arguments): the template bound to the arena (`_bind`)
        self._rows: list = []  # the ctypes objects standing for the row count in those calls, set per replay
        self._output: torch.Tensor | None = None  # the output's view at the largest size; a replay's is its rows
        self.num_replays = 0
        self.sizes_replayed: set[int] = set()

    def __getattr__(self, name: str):
        """Everything but the forward is the wrapped model's (vLLM's wrapper forwards the same way)."""
        if name == "runnable":  # not set yet (unpickling, or __init__ not run): no recursion
            raise AttributeError(name)
        return getattr(self.runnable, name)

    def unwrap(self) -> torch.nn.Module:
        return self.runnable

    @classmethod
    def maybe_wrap(cls, model, attn_layers: dict, attention_backend: str, max_num_reqs: int,
                   max_num_blocks_per_req: int):
        """The model wrapped where replays can serve: the CPU with the compiled ops and their attention backend,
        one rank (an all-reduce is not a C call), a model with vLLM's `inputs_embeds` path; else the model as it
        is. The largest batch is the C GEMM's (past it, oneDNN's GEMM is a torch op)."""
        param = next(model.parameters())
        if (attention_backend != "cpu" or get_tp_group().world_size != 1 or not hasattr(model, "get_input_embeddings")
                or not ops.compiled_cpu_ops_serve(param.device, param.dtype)):
            return model
        return cls(model, attn_layers, min(max_num_reqs, small_batch_rows(param.dtype)), max_num_blocks_per_req)

    def capture_model(self) -> None:
        """vLLM's capture_model, once the KV cache is bound: record the decode forward at the largest batch and
        at two requests and keep their template, or log why not (every step then runs eagerly). The template
        holds raw pointers to the weights and caches: a model moved or cast afterwards must be captured again."""
        # Two rows, not one, beside the largest: a single row's stride is whatever its view made it (unused).
        # Below three, one recording: its template serves that one size.
        sizes = (self.max_batch_size, 2) if self.max_batch_size > 2 else (self.max_batch_size,)
        self.template, self._calls = None, []
        try:
            traces = [self._record(n) for n in sizes]
            kept = regions(tensors_kept(self.runnable, (self.inputs_embeds, self.positions, self.slot_mapping,
                                                       self.seq_lens, self.query_start_loc, self.block_table)))
            self.template = derive_template(traces, sizes, kept)
        except CaptureRefused as e:
            logger.info("CPU graphs off, every step runs eagerly: %s", e)
            return
        self.arena = torch.empty(self.template.arena_bytes, dtype=torch.uint8)
        self._bind()
        logger.info("CPU graphs: decode batches of %d-%d requests replay %d C calls (arena %.2f MB)",
                    self.template.sizes[0], self.template.sizes[-1], len(self.template.calls), self.arena.numel() / 1e6)

    def _record(self, n: int) -> Trace:
        """The forward of n dummy decode requests (position 0, no KV write) on the persistent buffers, its C calls
        written down and not run (recorder.py says why that is safe)."""
        self.inputs_embeds[:n], self.positions[:n], self.slot_mapping[:n], self.seq_lens[:n] = 0, 0, -1, 1
        self.block_table[:n] = 0
        md = AttentionMetadata(n, 1, self.query_start_loc[:n + 1], 1, self.seq_lens[:n], self.block_table[:n],
                               self.slot_mapping[:n], list(range(n + 1)), [1] * n)
        recording, watch = Recording(_C._lib), Watch()
        _C._lib = recording
        try:
            with torch.inference_mode(), set_forward_context(md, self.attn_layers, slot_mapping=md.slot_mapping):
                with watch:
                    out = self.runnable(None, self.positions[:n], inputs_embeds=self.inputs_embeds[:n])
        finally:
            _C._lib = recording._lib
        if watch.refused:  # the Watch raised at the op; here as well, in case the model caught it
            raise CaptureRefused(watch.refused)
        return Trace(recording.calls, watch.allocs, out)

    def _replays(self, md: AttentionMetadata) -> bool:
        """A uniform decode batch (one token per request: no prefill chunk, no drafts) of a size the template serves."""
        n = md.num_actual_tokens
        return self.template is not None and md.max_query_len == 1 and n == md.num_reqs and n in self.template.sizes

    def __call__(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                 inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """The model's forward: [num_tokens, hidden_size]. A replay's output is a view into the arena, valid until
        the next replay."""
        md = get_forward_context().attn_metadata
        if inputs_embeds is not None or not self._replays(md):
            return self.runnable(input_ids, positions, inputs_embeds=inputs_embeds)
        n = md.num_actual_tokens
        self.inputs_embeds[:n] = self.runnable.get_input_embeddings(input_ids)
        self.positions[:n], self.slot_mapping[:n], self.seq_lens[:n] = positions, md.slot_mapping, md.seq_lens
        self.block_table[:n, :md.block_table.shape[1]] = md.block_table
        for rows in self._rows:
            rows.value = n
        for fn, args in self._calls:
            fn(*args)
        self.num_replays += 1
        self.sizes_replayed.add(n)
        return self._output[:n]

    def _bind(self) -> None:
        """The template's calls on this arena, each argument made its C type once, here, and the functions
        untyped copies, so a replay converts nothing (ctypes' argtypes convert every argument on every call).
        Every argument that is the row count is one shared object per C type, whose value a replay sets:
        ctypes reads it at each call, so one binding serves every size (no binding per size on first use)."""
        base, lib, (offset, hidden, dtype) = self.arena.data_ptr(), _C._lib, self.template.output
        rows: dict = {}  # C type -> the object every row-count argument of that type is
        self._calls = []
        for name, args in self.template.calls:
            fn = lib._FuncPtr((name, lib))  # no argtypes: the arguments below are ctypes objects already
            fn.restype = None
            self._calls.append((fn, tuple(rows.setdefault(kind, kind(0)) if a is ROWS else
                                          kind(base + a if type(a) is At else a)
                                          for kind, a in zip(_C.SIGNATURES[name][0], args))))
        self._rows = list(rows.values())
        largest = self.template.sizes[-1]
        self._output = self.arena[offset:offset + largest * hidden * dtype.itemsize].view(dtype).view(largest, hidden)
