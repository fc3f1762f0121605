"""Mirror of vllm/logger.py: one "minivllm" logger; the EngineCore child prefixes its pid.

MINIVLLM_LOGGING_LEVEL sets the level (default INFO). Lines carry no timestamps,
so what a run prints is the same every time apart from the child's pid.
"""
from __future__ import annotations

import logging
import os
import sys

from minivllm import envs

_NAME = "minivllm"


def init_logger(prefix: str = "") -> logging.Logger:
    logger = logging.getLogger(_NAME)
    logger.setLevel(envs.logging_level())
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}%(levelname)s minivllm: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    return logger


def init_engine_core_logger(process: str = "EngineCore") -> logging.Logger:
    """The logger of a child process, its lines prefixed "(<process> pid=N)" as vLLM's."""
    return init_logger(prefix=f"({process} pid={os.getpid()}) ")
