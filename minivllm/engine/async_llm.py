"""Mirror of vllm/v1/engine/async_llm.py: AsyncLLM, the online engine behind `minivllm serve`.

The same EngineCore child, scheduler and tracing as LLM; what differs is who drives it. LLM's
generate() loops `step()` until its own requests finish. Here many callers each `async for` over
`generate()`, and one background task, the output handler, awaits EngineCore's outputs, turns
them into RequestOutputs and drops each into its request's RequestOutputCollector. Tokenizing and
admitting a new request happen while EngineCore runs a step in its own process; tokenizing
and checking (process_inputs) run on one worker thread, as vLLM's async tokenizer, so a long
prompt never holds the event loop; EngineCore takes the request between two steps. A generator
that is closed early (the HTTP client went away) aborts its request, and EngineCore frees its
blocks before its next step. The config (dtype "auto") is resolved and every prompt is turned into an
EngineCoreRequest by the same code as LLMEngine's: engine/processor.py, through LLMEngine.__init__.

Where we differ from vLLM: AsyncLLM subclasses LLMEngine for its construction, Processor and output
processor (vLLM's two classes each build a Processor and an OutputProcessor), outputs are always
cumulative (the serving layer cuts the deltas; vLLM can ask for RequestOutputKind.DELTA), and
EngineCore always runs in a child process. Left out: pooling, LoRA, data parallelism, pause/resume.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncGenerator

from minivllm.config import EngineConfig
from minivllm.engine.core_client import AsyncMPClient, EngineDeadError
from minivllm.engine.llm_engine import LLMEngine
from minivllm.metrics.loggers import PrometheusStatLogger
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # what /v1/models lists when no model is named (the bundled one)


class RequestOutputCollector:
    """vLLM's: holds the latest output of one request until its generator takes it.

    Outputs are cumulative, so a newer one replaces one not taken yet: a slow reader skips
    intermediate states instead of queueing them. An error (the engine died) is kept as is.
    """

    def __init__(self, arrival_time: float, num_prompt_tokens: int) -> None:
        self.arrival_time, self.num_prompt_tokens = arrival_time, num_prompt_tokens  # for time to first token
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if not isinstance(self.output, BaseException):
            self.output = output
        self.ready.set()

    async def get(self) -> RequestOutput:
        await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


class AsyncLLM(LLMEngine):
    def __init__(self, config: EngineConfig, served_model_name: str | None = None) -> None:
        super().__init__(config)  # the same resolved EngineConfig, tokenizer and Processor as LLMEngine
        self.served_model_name = served_model_name or config.model or DEFAULT_MODEL_NAME
        spec = config.spec_config
        self.stat_logger = PrometheusStatLogger(self.served_model_name, spec.num_speculative_tokens if spec else 0)
        self.collectors: dict[str, RequestOutputCollector] = {}
        self.output_handler: asyncio.Task | None = None
        self.dead_error: EngineDeadError | None = None
        # vLLM's AsyncMicrobatchTokenizer runs on one thread too: tokenization off the event loop, in order
        self.input_executor = ThreadPoolExecutor(1, thread_name_prefix="minivllm-tokenizer")

    def _make_engine_core(self, multiprocess: bool | None) -> AsyncMPClient:
        return AsyncMPClient(self.config, self.model_folder)  # EngineCore always in its own process here

    async def run_in_input_thread(self, fn, *args):
        """Run fn(*args) on the tokenizer thread (tokenizing, rendering checks) and await its result."""
        return await asyncio.get_running_loop().run_in_executor(self.input_executor, fn, *args)

    @classmethod
    def from_engine_args(cls, engine_args: EngineConfig, served_model_name: str | None = None) -> "AsyncLLM":
        return cls(engine_args, served_model_name)

    @property
    def errored(self) -> bool:
        return self.dead_error is not None or not self.engine_core.process.is_alive()

    async def check_health(self) -> None:
        """Raise EngineDeadError once EngineCore is gone (GET /health turns 503)."""
        if self.errored:
            raise self.dead_error or EngineDeadError(f"EngineCore (pid={self.info['pid']}) is not running.")

    def _run_output_handler(self) -> None:
        if self.output_handler is None:
            self.output_handler = asyncio.get_running_loop().create_task(self._output_handler_loop())

    async def _output_handler_loop(self) -> None:
        """Await each step's outputs, process them, wake their generators; an engine failure wakes all."""
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                self.stat_logger.record_generation_tokens(sum(len(o.new_token_ids) for o in outputs.outputs))
                processed = self.output_processor.process_outputs(outputs.outputs)
                for output in processed.request_outputs:
                    collector = self.collectors.get(output.request_id)
                    if collector is not None:
                        collector.put(output)
                self.engine_core.abort_requests(processed.reqs_to_abort)  # stopped by a stop string
                if self.tracer is not None:
                    self.tracer.on_outputs(outputs, processed)
                else:  # a step traced just before the last /trace page left: nobody reads its events, drop them
                    self.engine_core.take_trace_events()
        except EngineDeadError as e:
            logger.error("EngineCore died: %s", e)
            self.dead_error = e
            for collector in self.collectors.values():
                collector.put(e)

    async def add_request(self, request_id: str, prompt, sampling_params: SamplingParams,
                          priority: int = 0) -> RequestOutputCollector:
        """Check, tokenize and send one request; its outputs will land in the returned collector.

        A ValueError (bad prompt or params) is raised before anything reaches EngineCore.
        """
        await self.check_health()
        self._run_output_handler()
        if request_id in self.collectors:
            raise ValueError(f"Request id {request_id!r} is already running: use a unique id.")
        text, request = await self.run_in_input_thread(self.process_inputs, request_id, prompt, sampling_params,
                                                       priority)
        if request_id in self.collectors:  # a twin admitted while this one was being tokenized
            raise ValueError(f"Request id {request_id!r} is already running: use a unique id.")
        collector = RequestOutputCollector(request.arrival_time, len(request.prompt_token_ids))
        self.collectors[request_id] = collector
        self.add_processed_requests([(text, request)])
        return collector

    async def iterate(self, request_id: str, collector: RequestOutputCollector) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's RequestOutput after every step that changed it, the finished one last.

        Cancelled or closed before the end (the HTTP client went away), it aborts the request.
        """
        finished, first = False, True
        try:
            while not finished:
                output = await collector.get()
                if first and any(c.token_ids for c in output.outputs):
                    first = False
                    self.stat_logger.record_first_token(collector.num_prompt_tokens,
                                                        time.time() - collector.arrival_time)
                finished = output.finished
                if finished:
                    for completion in output.outputs:
                        self.stat_logger.record_finished(completion.finish_reason)
                yield output
        finally:
            if not finished:
                self.abort([request_id])
            self.collectors.pop(request_id, None)

    def abort(self, request_ids: list[str]) -> None:
        """vLLM's AsyncLLM.abort: forget the requests here and free them in EngineCore; finished ones are skipped.

        The serving layer calls it too, in a `finally`: a handler cancelled before its generators
        ever started still gives its requests back.
        """
        processor = self.output_processor
        unfinished = [r for r in request_ids if r in processor.request_states or r in processor.parent_requests]
        for request_id in request_ids:
            self.collectors.pop(request_id, None)
        if unfinished and self.dead_error is None:
            self.abort_request(unfinished)

    async def generate(self, prompt, sampling_params: SamplingParams, request_id: str,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """vLLM's AsyncLLM.generate: add_request, then every output until the request finishes."""
        collector = await self.add_request(request_id, prompt, sampling_params, priority)
        async for output in self.iterate(request_id, collector):
            yield output

    def step(self) -> list[RequestOutput]:
        raise RuntimeError("AsyncLLM is driven by its output handler: iterate `generate()` instead of step().")

    async def get_stats_async(self) -> dict:
        return await self.engine_core.call_utility_async("get_stats")

    async def get_num_free_blocks_async(self) -> int:
        return await self.engine_core.call_utility_async("get_num_free_blocks")

    async def enable_tracing_async(self):
        """Record every step from here on (minivllm.tracing); returns the Trace being filled."""
        from minivllm.tracing.trace import Trace
        await self.engine_core.call_utility_async("enable_tracing")
        self.tracer = Trace(self.info, source=self.engine_core.take_trace_events)
        return self.tracer

    def shutdown(self) -> None:
        if self.output_handler is not None:
            self.output_handler.cancel()
        self.engine_core.shutdown()
        self.input_executor.shutdown(wait=False, cancel_futures=True)
