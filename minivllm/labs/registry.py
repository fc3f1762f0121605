"""The labs: which exercise file, which engine attribute each function replaces, and the graded checks.

A check is (name, observe, judge). `observe(sub, llm, obs)` runs in the grading process: `sub` maps function
names to the submission's functions (already patched into the engine), `llm` is that process's in-process
engine, and it records what happened, as plain data, in the dict `obs`. `judge(obs, ref)` runs in the grader's
own process: it compares `obs` with `ref`, the same observation made with the engine's own functions, and
raises LabCheckFailed (or returns: the check passed). Every check must call the submission's function.
Unit checks (no engine: unit_checks, unit_sched, unit_hash, unit_spec, unit_ngram, unit_budget, unit_prefix, unit_stop, unit_tp) come before the
engine's, so `check` stops at a failing unit check before the model loads. Labs 9-11 grade on the engine with
n-gram speculation (`speculative`: engine_checks.NGRAM) and their engine checks live in scenario_spec.
"""
from __future__ import annotations

import dataclasses

from minivllm.attention import layer as attention_layer
from minivllm.attention.backends import torch_attn
from minivllm.core import kv_cache_utils
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.sched import scheduler as scheduler_module
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine.output_processor import OutputProcessor
from minivllm.entrypoints.llm import LLM
from minivllm.labs import scenario_checks as sc
from minivllm.labs import scenario_spec as ss
from minivllm.labs import unit_budget as ub
from minivllm.labs import unit_checks as uc
from minivllm.labs import unit_hash as uh
from minivllm.labs import unit_ngram as un
from minivllm.labs import unit_prefix as upx
from minivllm.labs import unit_sched as us
from minivllm.labs import unit_spec as usp
from minivllm.labs import unit_stop as ust
from minivllm.labs import unit_stream as ust9
from minivllm.labs import unit_tp as utp
from minivllm.models.linear import RowParallelLinear
from minivllm.sample import sampler as sampler_module
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.worker import gpu_model_runner


@dataclasses.dataclass
class Lab:
    id: int
    title: str
    module: str  # exercise file name without .py
    functions: list[str]
    targets: dict  # function name -> [(object, attribute)] the grader patches
    checks: list  # [(check name, observe, judge)]
    minutes: str
    backend: str | None = None  # the attention backend the lab's engine runs
    # engine functions the checks cover that the student does not write (only a fault replaces them): name -> ours
    fixed: dict = dataclasses.field(default_factory=dict)
    forbidden: tuple = ()  # more engine function names a submission may not use (they do the lab's work)
    tripwires: tuple = ()  # more (object, attribute) a submission may not call: tripwires while it is imported
    engine: dict = dataclasses.field(default_factory=dict)  # name -> the engine's version where no target has it
    speculative: bool = False  # graded on the engine with n-gram speculation (engine_checks.NGRAM)

    def engine_functions(self) -> dict:
        """{name: the engine's own function} for every function the student writes: the reference."""
        ours = {name: getattr(*targets[0]) for name, targets in self.targets.items() if targets}
        return {**self.fixed, **ours, **self.engine}


def _engine_generate_loop(engine, prompts, params):
    """Lab 1's reference: LLM.generate's own loop (LLM._run_engine) on the given LLMEngine."""
    from types import SimpleNamespace
    ids = []
    for prompt in prompts:
        ids.append(engine.next_request_id())
        engine.add_request(ids[-1], prompt, params)
    return LLM._run_engine(SimpleNamespace(llm_engine=engine), ids, use_tqdm=False)


LABS = {
    1: Lab(1, "the generate loop: add_request, then step() until nothing is unfinished", "lab01_generate_loop",
           ["generate_loop"], {}, [("greedy tokens = LLM.generate", sc.lab1_outputs_observe, sc.lab1_outputs_judge),
                                   ("outputs in prompt order", sc.lab1_order_observe, sc.lab1_order_judge),
                                   ("chunked tokens = LLM.generate", sc.lab1_chunked_observe, sc.lab1_chunked_judge)],
           "20",
           forbidden=("_run_engine", "generate"), tripwires=((LLM, "_run_engine"), (LLM, "generate")),
           engine={"generate_loop": _engine_generate_loop}),
    2: Lab(2, "preemption by recompute: Scheduler._preempt_request", "lab02_preemption", ["_preempt_request"],
           {"_preempt_request": [(Scheduler, "_preempt_request")], "_num_new_tokens": [(Scheduler, "_num_new_tokens")],
            "_select_victim": [(Scheduler, "_select_victim")]},
           [("preemption: victim state and counters", us.lab2_observe, us.lab2_state_judge),
            ("preemption: shared blocks and free order", us.lab2_observe, us.lab2_blocks_judge),
            ("victim state", sc.lab2_victim_state_observe, sc.lab2_victim_state_judge),
            ("preempted tokens and victims = reference", sc.lab2_preempted_observe, sc.lab2_preempted_judge),
            ("chunked and preempted tokens = reference",
             *sc.tokens_check("chunked-preempted", "chunked prefill must not change tokens, preempted or not"))],
           "30", fixed={"_num_new_tokens": Scheduler._num_new_tokens, "_select_victim": Scheduler._select_victim}),
    3: Lab(3, "input packing: positions, query_start_loc, slot_mapping, logits_indices (pack_indices)",
           "lab03_input_packing", ["pack_indices"], {"pack_indices": [(gpu_model_runner, "pack_indices")]},
           [("indices = formula", uc.lab3_observe, uc.lab3_judge),
            ("greedy tokens = reference", *sc.tokens_check("greedy", "a decode row sits after the request's history")),
            ("chunked tokens = reference", *sc.tokens_check("chunked", "a later chunk continues where the last ended"))],
           "30", forbidden=("_prepare_inputs",)),
    4: Lab(4, "the forward context: get_attention_context(layer_name)", "lab04_forward_context",
           ["get_attention_context"], {"get_attention_context": [(attention_layer, "get_attention_context")]},
           [("context of the named layer", uc.lab4_observe, uc.lab4_judge),
            ("greedy tokens = reference", *sc.tokens_check("greedy", "each layer reads back the K/V it wrote")),
            ("chunked tokens = reference", *sc.tokens_check("chunked", "each layer keeps its own history"))], "20"),
    6: Lab(6, "the stop check and reclamation: check_stop, Scheduler._free_request", "lab06_stop_and_free",
           ["check_stop", "_free_request"],
           {"check_stop": [(scheduler_module, "check_stop")], "_free_request": [(Scheduler, "_free_request")]},
           [("stop check: every rule and boundary", us.lab6_stop_observe, us.lab6_stop_judge),
            ("free: request forgotten, runner told", us.lab6_free_observe, us.lab6_state_judge),
            ("free: shared blocks, free order, later hits", us.lab6_free_observe, us.lab6_blocks_judge),
            ("greedy tokens = reference",
             *sc.tokens_check("greedy", "max_tokens counts output tokens; stop when reached")),
            ("EOS tokens = reference", *sc.tokens_check("eos", "the last token equal to EOS ends the request")),
            ("preempted tokens = reference", *sc.tokens_check("preempted", "freed blocks go to the waiting requests"))],
           "30"),
    7: Lab(7, "prefix caching: the chained block hash hash_block_tokens", "lab07_block_hash", ["hash_block_tokens"],
           {"hash_block_tokens": [(kv_cache_utils, "hash_block_tokens")]},
           [("digest = the specified sha256", uh.lab7_digest_observe, uh.lab7_digest_judge),
            ("hash is chained, in order", uh.lab7_chain_observe, uh.lab7_chain_judge),
            ("shared suffix, different prefix: no hit",
             *sc.tokens_check("shared-suffix", "a block's name must cover its whole prefix",
                              hits="a block's name must cover its whole prefix: same tokens after another prefix "
                                   "is another block")),
            ("blocks in another order: no hit",
             *sc.tokens_check("swapped-blocks", "a block's name must cover its prefix in order",
                              hits="X then Y is not Y then X: the chain must depend on the order of the blocks")),
            ("same prompt again: a hit",
             *sc.tokens_check("repeated", "equal prefixes must hash equal",
                              hits="the same tokens after the same prefix must hash equal, in every process run")),
            ("greedy tokens = reference", *sc.tokens_check("greedy", "equal prefixes must hash equal"))], "20",
           forbidden=("get_request_block_hasher",)),
    5: Lab(5, "the paged KV cache: the write by slot_mapping and the read by block_table", "lab05_paged_kv",
           ["do_kv_cache_update", "gather_blocks"],
           {"do_kv_cache_update": [(torch_attn.TorchAttentionImpl, "do_kv_cache_update")],
            "gather_blocks": [(torch_attn, "gather_blocks")]},
           [("write and read = formula", uc.lab5_observe, uc.lab5_judge),
            ("greedy tokens = reference", *sc.tokens_check("greedy", "K/V must be read back where they were written")),
            ("chunked tokens = reference", *sc.tokens_check("chunked", "a later chunk reads the earlier chunks' KV")),
            ("preempted tokens = reference", *sc.tokens_check("preempted", "block ids are physical, any order"))],
           "40", "torch", forbidden=("reshape_and_cache_flash", "gather_history")),
    8: Lab(8, "sampling: top-k and top-p, apply_top_k_top_p", "lab08_top_k_top_p", ["apply_top_k_top_p"],
           {"apply_top_k_top_p": [(sampler_module, "apply_top_k_top_p")]},
           [("masks = formula", uc.lab8_observe, uc.lab8_judge),
            ("seeded sampled tokens = reference", *sc.tokens_check("sampled", "top-k then top-p on the sorted row"))],
           "40"),
    9: Lab(9, "speculative decoding: the rejection sampler, RejectionSampler.__call__", "lab09_rejection_sampler",
           ["rejection_sample"], {"rejection_sample": [(RejectionSampler, "__call__")]},
           [("greedy: kept prefix, then the target token", usp.lab9_greedy_observe, usp.lab9_greedy_judge),
            ("greedy: the bonus after every kept draft", usp.lab9_bonus_observe, usp.lab9_bonus_judge),
            ("random: the target distribution", usp.lab9_random_observe, usp.lab9_random_judge),
            ("random: every request on its own generator", usp.lab9_generator_observe, usp.lab9_generator_judge),
            (ust9.CHECK, ust9.lab9_stream_observe, ust9.lab9_stream_judge),
            ("n-gram speculation: greedy tokens = reference",
             *ss.spec_check("speculative", "n-gram speculation: greedy tokens = reference", "a greedy request keeps "
                            "its drafts while they equal the argmax, then gets one token more", "accepted"))],
           "40", speculative=True),
    10: Lab(10, "speculative decoding: the n-gram proposer, NgramProposer.propose", "lab10_ngram_proposer",
            ["propose"], {"propose": [(NgramProposer, "propose")]},
            [("drafts: the longest n-gram, first match", un.lab10_matches_observe, un.lab10_matches_judge),
             ("drafts: at most k, never past max_model_len", un.lab10_limits_observe, un.lab10_limits_judge),
             ("generated sequences = reference", un.lab10_generated_observe, un.lab10_generated_judge),
             ("n-gram speculation: drafts and tokens = reference",
              *ss.spec_check("to-max-model-len", "n-gram speculation: drafts and tokens = reference", "the drafts of a "
                             "step are what followed the suffix's first earlier occurrence, longest n first",
                             "drafts"))],
            "30", speculative=True),
    11: Lab(11, "the token budget of a step: Scheduler._num_new_tokens", "lab11_token_budget", ["_num_new_tokens"],
            {"_num_new_tokens": [(Scheduler, "_num_new_tokens")]},
            [("running: drafts, budget, max_model_len", ub.lab11_running_observe, ub.lab11_running_judge),
             ("admission: the hit, threshold, whole or nothing", ub.lab11_admit_observe, ub.lab11_admit_judge),
             ("chunked under a threshold: schedule = reference",
              *ss.spec_check("threshold", "chunked under a threshold: schedule = reference", "with chunked prefill "
                             "on, a prompt comes in chunks of at most long_prefill_token_threshold", "schedule")),
             ("no chunked prefill: schedule = reference",
              *ss.spec_check("unchunked", "no chunked prefill: schedule = reference", "without chunked prefill a "
                             "prompt is admitted whole, when it fits the budget left", "schedule")),
             ("no chunked prefill, an exact fit: schedule = reference",
              *ss.spec_check("exact-fit", "no chunked prefill, an exact fit: schedule = reference", "without "
                             "chunked prefill a prompt whose rest equals the budget left fits: it is admitted whole "
                             "in that step", "schedule")),
             ("up to max_model_len: schedule = reference",
              *ss.spec_check("to-max-model-len", "up to max_model_len: schedule = reference", "drafts are "
                             "scheduled like other tokens, never at position max_model_len - 1", "schedule"))],
            "30", speculative=True),
    12: Lab(12, "prefix caching: the lookup, KVCacheManager.get_computed_blocks", "lab12_prefix_lookup",
            ["get_computed_blocks"], {"get_computed_blocks": [(KVCacheManager, "get_computed_blocks")]},
            [("lookup: the longest cached prefix, capped", upx.lab12_lookup_observe, upx.lab12_lookup_judge),
             ("lookup: nothing taken, the pool unchanged", upx.lab12_lookup_observe, upx.lab12_state_judge),
             ("same prompt again: a hit", *sc.tokens_check("repeated", "the hits are the cached prefix, capped",
                                                           hits="the same prompt again hits its whole blocks up to "
                                                                "num_tokens - 1")),
             ("blocks in another order: no hit", *sc.tokens_check("swapped-blocks", "stop at the first miss",
                                                                  hits="a block is of use only after its whole "
                                                                       "prefix hit: stop at the first miss")),
             ("preempted: schedule, blocks and tokens = reference",
              *sc.tokens_check("preempted", "a lookup takes no block", steps="a preempted request is looked up "
                               "again when it is readmitted: its blocks still cached are hits, and it recomputes "
                               "only the rest"))], "30"),
    13: Lab(13, "stop strings on incremental text: OutputProcessor._check_stop_strings", "lab13_stop_strings",
            ["_check_stop_strings"], {"_check_stop_strings": [(OutputProcessor, "_check_stop_strings")]},
            [("stop strings: the window, the order, the cut", ust.lab13_unit_observe, ust.lab13_unit_judge),
             ("in the engine: stopped text = reference", ust.lab13_engine_observe, ust.lab13_engine_judge)], "30"),
    14: Lab(14, "tensor parallelism: RowParallelLinear's weight_loader, local_bias and forward", "lab14_row_parallel",
            ["weight_loader", "local_bias", "forward"],
            {name: [(RowParallelLinear, name)] for name in ("weight_loader", "local_bias", "forward")},
            [("weight_loader: each rank its columns", utp.lab14_loader_observe, utp.lab14_loader_judge),
             ("local_bias: the bias once", utp.lab14_bias_observe, utp.lab14_bias_judge),
             ("forward: partial sums, all-reduced", utp.lab14_forward_observe, utp.lab14_forward_judge),
             ("forward: the collectives each rank performs", utp.lab14_forward_observe, utp.lab14_collectives_judge),
             ("greedy tokens = reference", *sc.tokens_check("greedy", "at tp_size 1: the plain product, no sum"))],
            "30"),
}

LABS = dict(sorted(LABS.items()))  # lab number order for list and grade
