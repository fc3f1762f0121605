"""Load test of `minivllm serve`: 64 concurrent streaming clients (AsyncOpenAI) on 127.0.0.1, random lengths.

Bounded in count (64 requests, 4-16 tokens each) and in time (a pytest timeout). Every request must
finish with exactly its max_tokens (ignore_eos), its greedy text must equal LLM.generate's for the
same prompt, and no KV block may stay held afterwards. Clients start at staggered moments, so
requests are admitted while others decode. Time to first token (p50/p99) is printed, not asserted.
"""
from __future__ import annotations

import asyncio
import random
import time

import openai
import pytest

from conftest import PROMPTS

NUM_CLIENTS = 64


def _requests() -> list[tuple[str, int, float]]:
    """(prompt, max_tokens, start delay in seconds) per client, from a fixed seed."""
    rng = random.Random(0)
    words = " ".join(PROMPTS).split()
    out = []
    for _ in range(NUM_CLIENTS):
        start = rng.randrange(len(words) - 30)
        out.append((" ".join(words[start:start + rng.randint(2, 30)]), rng.randint(4, 16), rng.uniform(0, 1.5)))
    return out


async def _one_client(client, prompt: str, max_tokens: int, delay: float) -> dict:
    await asyncio.sleep(delay)
    sent = time.perf_counter()
    first, text, usage, finish = None, "", None, None
    stream = await client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=max_tokens,
                                             temperature=0, stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.choices:
            if first is None and chunk.choices[0].text:
                first = time.perf_counter() - sent
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return {"text": text, "usage": usage, "finish": finish, "ttft": first}


async def _run_clients(url: str, requests) -> list[dict]:
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=300)
    try:
        return await asyncio.gather(*[_one_client(client, *r) for r in requests])
    finally:
        await client.close()


@pytest.mark.timeout(600)
def test_64_concurrent_streaming_clients_match_llm_generate_and_leak_no_block():
    from minivllm import LLM, SamplingParams
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread

    requests = _requests()
    server = ServerThread(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256)))
    try:
        results = asyncio.run(_run_clients(server.url, requests))
        stats = server.run_coroutine(server.engine.get_stats_async())
    finally:
        server.stop()
    assert stats["num_unfinished"] == 0 and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1  # no leak

    with LLM(max_model_len=256) as llm:
        expected = llm.generate([p for p, _, _ in requests],
                                [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for _, m, _ in requests],
                                use_tqdm=False)
    for (prompt, max_tokens, _), result, reference in zip(requests, results, expected):
        assert result["finish"] == "length"
        assert result["usage"].completion_tokens == max_tokens
        assert result["usage"].prompt_tokens == len(reference.prompt_token_ids)
        assert result["text"] == reference.outputs[0].text, prompt

    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    p50, p99 = ttfts[len(ttfts) // 2], ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))]
    print(f"\n{NUM_CLIENTS} streaming clients: time to first token p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
