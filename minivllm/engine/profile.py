"""An opt-in profile of EngineCore.step(): wall time per phase, measured on a live in-process engine.

Phases: schedule, prepare inputs (state deltas + packing), forward (the model, attention
included), sample (lm_head on logits_indices rows + sampler), update (update_from_output),
output processing (detokenize, stop strings, in the caller). Timers wrap the engine's own
methods on one instance; nothing else changes. Not used unless asked for (benchmarks --profile).
"""
from __future__ import annotations

import time
from collections import defaultdict


def _timed(totals: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
    return wrapper


def profile_engine(llm, prompts, max_tokens) -> dict[str, float]:
    """Run the workload on `llm` (in-process) with phase timers; return seconds per phase, plus "other"."""
    from minivllm import SamplingParams
    client = llm.llm_engine.engine_core
    if not hasattr(client, "engine_core"):
        raise ValueError("profile_engine needs an in-process engine: LLM(..., multiprocess=False)")
    core = client.engine_core
    runner, scheduler = core.model_executor.driver_worker.model_runner, core.scheduler
    model = runner.get_model()
    totals: dict[str, float] = defaultdict(float)
    patches = [(scheduler, "schedule", "schedule"), (runner, "_update_states", "prepare inputs"),
               (runner, "_prepare_inputs", "prepare inputs"), (model, "forward", "forward"),
               (model, "compute_logits", "sample"), (runner, "sampler", "sample"),
               (scheduler, "update_from_output", "update"),
               (llm.llm_engine.output_processor, "process_outputs", "output processing")]
    originals = [(obj, attr, obj.__dict__.get(attr)) for obj, attr, _ in patches]
    for obj, attr, name in patches:
        setattr(obj, attr, _timed(totals, name, getattr(obj, attr)))
    try:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
    finally:
        for obj, attr, original in reversed(originals):
            if original is None:
                delattr(obj, attr)  # a method: the class's shows through again
            else:
                setattr(obj, attr, original)  # an instance attribute (the sampler): put it back
    phases = dict(totals)
    phases["other (python glue)"] = wall - sum(phases.values())
    return phases
