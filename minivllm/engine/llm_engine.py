"""Mirror of vllm/v1/engine/llm_engine.py: the caller-side engine between LLM and EngineCore.

`add_request` tokenizes and validates in the caller's process (engine/processor.py, the front end
AsyncLLM shares), then hands an EngineCoreRequest to the client. `step()` submits nothing and runs nothing
itself: it takes outputs EngineCore already produced, detokenizes them, checks
stop strings and aborts the requests those stopped. Left out: input
preprocessing for multimodal prompts, stats loggers, LoRA.
"""
from __future__ import annotations

import itertools
import logging

from minivllm.config import EngineConfig, default_sampling_overrides
from minivllm.engine import EngineCoreRequest
from minivllm.engine.core_client import make_client
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.processor import Processor, resolve_engine_config
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.utils.gc_utils import gc_paused

logger = logging.getLogger("minivllm")


class LLMEngine:
    def __init__(self, config: EngineConfig, multiprocess: bool | None = None) -> None:
        with gc_paused():  # start-up: what it builds lives on (utils/gc_utils.py)
            from transformers import AutoTokenizer
            # "auto" resolved once, in processor.py, for this process and EngineCore's; AsyncLLM comes through here too
            config, self.model_folder, self.hf_config = resolve_engine_config(config)
            self.config = config
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_folder)
            self.sampling_overrides = default_sampling_overrides(self.model_folder, config.generation_config)
            if self.sampling_overrides:
                logger.info("Default sampling parameters from the model's generation_config.json: %s (pass "
                            "generation_config='vllm' to ignore them)", self.sampling_overrides)
            self.engine_core = self._make_engine_core(multiprocess)
            self.info = self.engine_core.info
            self.processor = Processor(config, self.tokenizer, self.hf_config.vocab_size, self.info)
            self.output_processor = OutputProcessor(self.tokenizer)
            self._request_counter = itertools.count()
            self.tracer = None

    def _make_engine_core(self, multiprocess: bool | None):
        """The EngineCore client: in-process or a child process (AsyncLLM: always its asyncio client)."""
        return make_client(self.config, self.model_folder, multiprocess)

    @classmethod
    def from_engine_args(cls, engine_args: EngineConfig, multiprocess: bool | None = None) -> "LLMEngine":
        """As vLLM: build the engine from an EngineArgs (any EngineConfig will do)."""
        if not isinstance(engine_args, EngineConfig):
            raise ValueError(f"from_engine_args takes an EngineArgs, got {type(engine_args).__name__}: "
                             f"EngineArgs(model=..., ...) or EngineArgs.from_cli_args(args).")
        return cls(engine_args, multiprocess)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (none with generation_config="vllm")."""
        return SamplingParams(**self.sampling_overrides)

    def start_profile(self) -> None:
        self._check_profiler()
        self.engine_core.call_utility("profile", True)

    def stop_profile(self) -> None:
        self._check_profiler()
        self.engine_core.call_utility("profile", False)

    def _check_profiler(self) -> None:
        if not self.config.profiler_config or not self.config.profiler_config.get("profiler"):
            raise ValueError("The profiler is off: create the engine with profiler_config={'profiler': 'torch', "
                             "'torch_profiler_dir': './profile'} to use start_profile()/stop_profile().")

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def next_request_id(self) -> str:
        return str(next(self._request_counter))

    def process_inputs(self, request_id: str, prompt, params: SamplingParams,
                       priority: int = 0) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate (engine/processor.py); raise ValueError naming what to change. Nothing is sent."""
        return self.processor.process_inputs(request_id, prompt, params, priority)

    def add_request(self, request_id: str | None, prompt: str | list[int], params: SamplingParams | None = None,
                    priority: int = 0) -> str:
        request_id = request_id if request_id is not None else self.next_request_id()
        text, request = self.process_inputs(request_id, prompt, params or SamplingParams(), priority)
        self.add_processed_request(text, request)
        return request_id

    def add_processed_request(self, text: str | None, request: EngineCoreRequest) -> None:
        self.add_processed_requests([(text, request)])

    def add_processed_requests(self, processed: list[tuple[str | None, EngineCoreRequest]]) -> None:
        """Register and send; a request with n > 1 goes as n children "{index}_{id}" (vLLM's ParentRequest)."""
        to_send = []
        for text, request in processed:
            children = self.processor.fan_out(request)
            for child, parent, index in children:
                self.output_processor.add_request(child.request_id, text, child.prompt_token_ids,
                                                  child.sampling_params, parent, index)
                if self.tracer is not None:
                    self.tracer.on_submit(child, text)
                to_send.append(child)
        self.engine_core.add_requests(to_send)

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.get_output()  # 1. outputs EngineCore already produced
        processed = self.output_processor.process_outputs(outputs.outputs)  # 2. detokenize, stop strings
        self.engine_core.abort_requests(processed.reqs_to_abort)  # 3. free what a stop string ended
        if self.tracer is not None:
            self.tracer.on_outputs(outputs, processed)
        return processed.request_outputs

    def enable_tracing(self):
        """Record every step from here on (see minivllm.tracing); returns the Trace being filled."""
        from minivllm.tracing.trace import Trace
        self.engine_core.call_utility("enable_tracing")
        self.engine_core.take_trace_events()  # nothing from an earlier trace leaks into this one
        self.tracer = Trace(self.info, source=self.engine_core.take_trace_events)
        return self.tracer

    def collect_trace(self):
        """Pull events EngineCore recorded after its last output (late aborts) into the trace."""
        if self.tracer is not None:
            self.tracer.extend(self.engine_core.take_trace_events())
            self.tracer.extend(self.engine_core.call_utility("drain_trace"))
        return self.tracer

    def disable_tracing(self) -> None:
        """Stop recording: EngineCore detaches its tracer (the Trace collected so far is kept)."""
        self.engine_core.call_utility("disable_tracing")

    def abort_request(self, request_ids: list[str]) -> None:
        """Abort requests; the id of an n > 1 request aborts its children still running."""
        children = self.output_processor.abort_requests(request_ids)
        self.engine_core.abort_requests(list(dict.fromkeys([*request_ids, *children])))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_free_blocks(self) -> int:
        return self.engine_core.call_utility("get_num_free_blocks")

    def get_stats(self) -> dict:
        return self.engine_core.call_utility("get_stats")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix in EngineCore; False while requests are running (as vLLM)."""
        return self.engine_core.call_utility("reset_prefix_cache")

    def shutdown(self) -> None:
        self.engine_core.shutdown()
