"""Mirror of vllm/v1/metrics/stats.py: the scheduler's state as the numbers /metrics and get_stats() report.

vLLM's Scheduler.make_stats() fills a SchedulerStats dataclass each step; here one function reads the same numbers
into a dict when asked (EngineCore.get_stats, the /metrics scrape). The spec-decode counters are present only
when speculative decoding is on.
"""
from __future__ import annotations


def make_stats(scheduler) -> dict:
    cache, kv = scheduler.kv_cache_manager.prefix_cache_stats, scheduler.kv_cache_manager
    stats = {"num_preemptions": scheduler.num_preemptions, "num_free_blocks": kv.block_pool.get_num_free_blocks(),
             "kv_cache_usage": kv.usage, "num_unfinished": scheduler.get_num_unfinished_requests(),
             "num_running": len(scheduler.running), "num_waiting": len(scheduler.waiting),
             "prefix_cache_queries": cache.queries, "prefix_cache_hits": cache.hits,
             "prefix_cache_preempted_queries": cache.preempted_queries,
             "prefix_cache_preempted_hits": cache.preempted_hits}
    spec = scheduler.spec_decoding_stats
    if spec is not None:
        stats.update(spec_decode_num_drafts=spec.num_drafts, spec_decode_num_draft_tokens=spec.num_draft_tokens,
                     spec_decode_num_accepted_tokens=spec.num_accepted_tokens,
                     spec_decode_num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos))
    return stats
