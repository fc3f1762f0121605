"""The engine runs the figures are drawn from: each is the run a notebook prints, on a fresh engine.

So a figure's step numbers, request ids and block ids are the ones its notebook shows (fig4 resumes the
victim at the step notebook 02 prints; fig5 is notebook 03's packing of the article's A, B and C; fig9 is
notebook 07's staggered A-then-B admission, which run_traced's one-message submit cannot reproduce).
tests/test_figures.py runs notebook 02's own cell and checks that fig4 agrees with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minivllm import LLM, SamplingParams
from minivllm.tracing import Trace
from minivllm.tracing import run_traced


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kw)


# notebook -> (LLM engine arguments, the traced requests), as its cells write them
NOTEBOOK_RUNS = {
    "01_request_lifecycle": ({}, [("Once upon a time", greedy(4))]),
    "02_scheduler": (dict(multiprocess=False, num_gpu_blocks_override=6, block_size=8, max_model_len=256),
                     [("Once upon a time", greedy(12)), ("The capital of France is", greedy(12, ignore_eos=True)),
                      ("Write a haiku about the sea.", greedy(12, ignore_eos=True))]),
    "03_input_packing": (dict(multiprocess=False, max_model_len=512, max_num_batched_tokens=12),
                         [("Once upon a time", greedy(5)),
                          ("In a paged KV cache, every request owns a list of physical blocks.",
                           greedy(3, ignore_eos=True)),
                          ("The capital of France is", greedy(4, ignore_eos=True))]),
    "04_forward_context": (dict(multiprocess=False, max_model_len=512), [("Once upon a time", greedy(1))]),
    "05_paged_kv_cache": (dict(multiprocess=False, max_model_len=512, max_num_batched_tokens=16),
                          [("Once upon a time", greedy(6)),
                           ("In a paged KV cache, every request owns a list of physical blocks, and the block table "
                            "maps each logical block to one of them.", greedy(2))]),
    "06_sampling_and_reclamation": (dict(multiprocess=False, max_model_len=512),
                                    [("Once upon a time", greedy(6)),
                                     ("The capital of France is", greedy(3, ignore_eos=True))]),
}
SYSTEM = ("You are a helpful assistant. Answer every question in one short sentence, plainly and "
          "truthfully, and never make up facts that you do not know for certain. ")
# notebook 07: A is added and steps once alone, then B arrives and is admitted on A's cached blocks
PREFIX_RUN = (dict(multiprocess=False, num_gpu_blocks_override=12, block_size=16, max_model_len=256),
              {"A": (SYSTEM + "Question: What is the capital of France? Answer:", greedy(6, ignore_eos=True)),
               "B": (SYSTEM + "Question: Who wrote the play Hamlet? Answer:", greedy(6, ignore_eos=True))})


@dataclass
class Runs:
    traces: dict[str, Trace]  # notebook name -> its traced run
    packing: dict  # the article's A/B/C step: {"batch": describe_batch(...), "block_size": 16}
    num_layers: int
    decode: Callable[[int], str]
    prefix: dict  # notebook 07: {"trace", "step": B's admission, "blocks": {req: [(id, ref_cnt, hash hex)]}}


def prefix_cache_run(model: str | None = None) -> dict:
    """Notebook 07's admission cell on a fresh engine, traced to the end; right after B's admission step it
    reads every block A and B hold from the live KVCacheManager: (block_id, ref_cnt, block hash hex or None)."""
    engine_args, requests = PREFIX_RUN
    llm = LLM(model, **engine_args)
    engine = llm.llm_engine
    manager = engine.engine_core.engine_core.scheduler.kv_cache_manager
    try:
        trace = engine.enable_tracing()
        for name, (prompt, params) in requests.items():
            engine.add_request(name, prompt, params)
            engine.step()
        blocks = {r: [(b.block_id, b.ref_cnt, b.block_hash and b.block_hash.hex()) for b in manager.req_to_blocks[r]]
                  for r in requests}
        while engine.has_unfinished_requests():
            engine.step()
        return {"trace": trace, "step": len(requests), "blocks": blocks}
    finally:
        llm.shutdown()


def article_packing(llm: LLM) -> dict:
    """Notebook 03's first cell: A prefills 4 tokens, B and C decode at positions 50 and 30, through the
    engine's own GPUModelRunner (`_update_states`, `_prepare_inputs`), with scattered block lists."""
    from minivllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from minivllm.tracing.tracer import describe_batch
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner
    tokenizer = llm.get_tokenizer()
    A = tokenizer.encode("Once upon a time")
    B = tokenizer.encode("word " * 60)[:51]  # 50 tokens already cached; B0 = B[50] runs at position 50
    C = tokenizer.encode("item " * 40)[:31]  # C0 = C[30] at position 30
    params = SamplingParams(temperature=0)
    plan = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("A", A, params, [3], 0), NewRequestData("B", B, params, [9, 4, 12, 7], 50),
                            NewRequestData("C", C, params, [5, 11], 30)],
        scheduled_cached_reqs=CachedRequestData(), num_scheduled_tokens={"A": 4, "B": 1, "C": 1},
        total_num_scheduled_tokens=6, finished_req_ids=set())
    runner._update_states(plan)
    batch = describe_batch(runner._prepare_inputs(plan))
    runner._update_states(SchedulerOutput([], CachedRequestData(), {}, 0, {"A", "B", "C"}))  # hand the rows back
    return {"batch": batch, "block_size": llm.llm_engine.info["block_size"]}


def trace_notebook(name: str, model: str | None = None) -> Trace:
    """The traced run of one notebook, on a fresh engine (as the notebook has)."""
    engine_args, requests = NOTEBOOK_RUNS[name]
    llm = LLM(model, **engine_args)
    try:
        return run_traced(llm, requests)
    finally:
        llm.shutdown()


def collect(model: str | None = None) -> Runs:
    """Every notebook's run, the article's packing step, and what the figures need to label them."""
    llm = LLM(model, multiprocess=False, max_model_len=512)
    try:
        packing, tokenizer = article_packing(llm), llm.get_tokenizer()
        num_layers = llm.llm_engine.hf_config.num_hidden_layers
    finally:
        llm.shutdown()
    traces = {name: trace_notebook(name, model) for name in NOTEBOOK_RUNS}
    return Runs(traces, packing, num_layers, decode=lambda t: tokenizer.decode([t]), prefix=prefix_cache_run(model))
