"""Mirror of vllm/v1/metrics/loggers.py: PrometheusStatLogger, the server's /metrics, with vLLM's names.

One CollectorRegistry per server (not prometheus_client's global one, so two servers in one test
process do not collide). Counters and the time-to-first-token histogram are fed by AsyncLLM as
outputs arrive; the queue and KV-cache gauges are read from EngineCore.get_stats() when /metrics
is scraped. vLLM instead ships SchedulerStats with every step's outputs; the numbers are the same
kind, only sampled at scrape time. With speculative decoding, vLLM's four spec-decode counters (drafts, draft
tokens, accepted tokens, accepted tokens per position) come from get_stats() the same way. Left out: per-engine
labels, LoRA, iteration and inter-token histograms, the logging stat logger.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's buckets for time to first token (seconds)
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]


class PrometheusStatLogger:
    def __init__(self, model_name: str, num_spec_tokens: int = 0) -> None:
        self.registry = CollectorRegistry()
        labels, r = ["model_name"], self.registry
        self.gauge_scheduler_running = Gauge("vllm:num_requests_running", "Requests in the RUNNING queue.",
                                             labels, registry=r).labels(model_name)
        self.gauge_scheduler_waiting = Gauge("vllm:num_requests_waiting", "Requests in the WAITING queue.",
                                             labels, registry=r).labels(model_name)
        self.gauge_kv_cache_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means every block used.",
                                          labels, registry=r).labels(model_name)
        # prometheus_client adds "_total" to counters, as vLLM's vllm:prompt_tokens_total
        self.counter_prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.",
                                             labels, registry=r).labels(model_name)
        self.counter_generation_tokens = Counter("vllm:generation_tokens", "Generation tokens processed.",
                                                 labels, registry=r).labels(model_name)
        self.counter_prefix_cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the "
                                                    "prefix cache.", labels, registry=r).labels(model_name)
        self.counter_prefix_cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix "
                                                 "cache.", labels, registry=r).labels(model_name)
        self.counter_request_success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                                               labels + ["finished_reason"], registry=r)
        self.histogram_time_to_first_token = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                                                       labels, buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.model_name = model_name
        self._cache_seen = (0, 0)  # EngineCore's prefix-cache (queries, hits) at the last scrape
        self.spec_counters: dict[str, Counter] = {}
        if num_spec_tokens:
            for key, doc in (("num_drafts", "Verified steps of a request that carried drafts."),
                             ("num_draft_tokens", "Draft tokens verified."),
                             ("num_accepted_tokens", "Draft tokens accepted.")):
                self.spec_counters[key] = Counter(f"vllm:spec_decode_{key}", doc, labels,
                                                  registry=r).labels(model_name)
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Drafts accepted at each position.",
                              labels + ["position"], registry=r)
            self.spec_per_pos = [per_pos.labels(model_name, str(pos)) for pos in range(num_spec_tokens)]
        self._spec_seen: list[int] = []  # the cumulative get_stats() values at the last scrape

    def record_first_token(self, num_prompt_tokens: int, seconds: float) -> None:
        self.counter_prompt_tokens.inc(num_prompt_tokens)
        self.histogram_time_to_first_token.observe(seconds)

    def record_generation_tokens(self, num_tokens: int) -> None:
        self.counter_generation_tokens.inc(num_tokens)

    def record_finished(self, finish_reason: str) -> None:
        self.counter_request_success.labels(self.model_name, finish_reason).inc()

    def render(self, stats: dict) -> bytes:
        """The Prometheus text exposition, after reading EngineCore.get_stats() into the gauges."""
        self.gauge_scheduler_running.set(stats["num_running"])
        self.gauge_scheduler_waiting.set(stats["num_waiting"])
        self.gauge_kv_cache_usage.set(stats["kv_cache_usage"])
        queries, hits = stats["prefix_cache_queries"], stats["prefix_cache_hits"]
        # get_stats counts since the last reset_prefix_cache(): a drop means a reset, start again from it
        seen_q, seen_h = self._cache_seen if queries >= self._cache_seen[0] else (0, 0)
        self.counter_prefix_cache_queries.inc(queries - seen_q)
        self.counter_prefix_cache_hits.inc(max(hits - seen_h, 0))
        self._cache_seen = (queries, hits)
        self._count_spec_decode(stats)
        return generate_latest(self.registry)

    def _count_spec_decode(self, stats: dict) -> None:
        """Advance the spec-decode counters by what EngineCore counted since the last scrape."""
        if not self.spec_counters:
            return
        pairs = [(counter, stats[f"spec_decode_{key}"]) for key, counter in self.spec_counters.items()]
        pairs += zip(self.spec_per_pos, stats["spec_decode_num_accepted_tokens_per_pos"])
        for (counter, value), before in zip(pairs, self._spec_seen or [0] * len(pairs)):
            counter.inc(value - before)
        self._spec_seen = [value for _, value in pairs]
