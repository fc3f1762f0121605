"""Mirror of vllm/config/profiler.py and vllm/profiler/: the torch profiler, started and stopped from LLM.

`LLM(profiler_config={"profiler": "torch", "torch_profiler_dir": "..."})`, then `llm.start_profile()` and
`llm.stop_profile()`: EngineCore (in whichever process it runs) records every op in between with
torch.profiler and writes one Chrome/Perfetto trace, `<dir>/<worker>.<time>.pt.trace.json[.gz]`.
The option names and defaults are vLLM's. Left out: the "cuda" profiler (nsys ranges), delayed or capped
iteration windows, and a second trace of the caller's process.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger("minivllm")

# vLLM's defaults for the options minivllm honours.
PROFILER_DEFAULTS = {"profiler": None, "torch_profiler_dir": "", "torch_profiler_with_stack": True,
                     "torch_profiler_with_flops": False, "torch_profiler_use_gzip": True,
                     "torch_profiler_record_shapes": False, "torch_profiler_with_memory": False}


def check_profiler_config(config: dict) -> dict:
    """The options with vLLM's defaults filled in; anything minivllm cannot honour is a ValueError."""
    unknown = sorted(set(config) - set(PROFILER_DEFAULTS))
    if unknown:
        raise ValueError(f"profiler_config has options minivllm does not support: {unknown}; it takes "
                         f"{sorted(PROFILER_DEFAULTS)}.")
    full = {**PROFILER_DEFAULTS, **config}
    if full["profiler"] not in (None, "torch"):
        raise ValueError(f"profiler_config['profiler']={full['profiler']!r}: minivllm has only the 'torch' "
                         f"profiler (vLLM's 'cuda' profiler marks ranges for nsys, which needs a CUDA build).")
    if full["profiler"] == "torch" and not (isinstance(full["torch_profiler_dir"], str) and full["torch_profiler_dir"]):
        raise ValueError("profiler_config needs 'torch_profiler_dir', the folder the trace is written to.")
    for key, default in PROFILER_DEFAULTS.items():
        if isinstance(default, bool) and not isinstance(full[key], bool):
            raise ValueError(f"profiler_config[{key!r}] must be True or False, got {full[key]!r}.")
    return full


class TorchProfiler:
    """One torch.profiler session per start()/stop() pair, written out when it stops."""

    def __init__(self, config: dict, worker_name: str) -> None:
        self.config = check_profiler_config(config)
        self.worker_name = worker_name
        self._profile = None

    @property
    def is_running(self) -> bool:
        return self._profile is not None

    def start(self) -> None:
        import torch
        if self.is_running:
            raise RuntimeError("The profiler is already running: call stop_profile() first.")
        folder = Path(self.config["torch_profiler_dir"]).expanduser().resolve()
        folder.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        c = self.config
        self._profile = torch.profiler.profile(
            activities=activities, record_shapes=c["torch_profiler_record_shapes"],
            profile_memory=c["torch_profiler_with_memory"], with_stack=c["torch_profiler_with_stack"],
            with_flops=c["torch_profiler_with_flops"],
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                str(folder), worker_name=self.worker_name, use_gzip=c["torch_profiler_use_gzip"]))
        self._profile.start()
        logger.info("torch profiler started in %s (pid %d); traces go to %s", self.worker_name, os.getpid(), folder)

    def stop(self) -> None:
        if not self.is_running:
            raise RuntimeError("The profiler is not running: call start_profile() first.")
        profile, self._profile = self._profile, None
        profile.stop()  # on_trace_ready writes the trace file here
        logger.info("torch profiler stopped; trace written to %s", self.config["torch_profiler_dir"])
