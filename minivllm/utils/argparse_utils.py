"""Mirror of vllm/utils/argparse_utils.py: FlexibleArgumentParser.

An argparse.ArgumentParser that also takes `--max_model_len 64` and `--max_model_len=64` for
`--max-model-len`, as vLLM's does, so commands written for either spelling work. Left out:
vLLM's `--config file.yaml` and its dotted `--profiler-config.key=value` forms (pass the JSON).
"""
from __future__ import annotations

import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        import sys
        args = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args([_dashed(a) for a in args], namespace)


def _dashed(arg: str) -> str:
    """`--max_model_len=64` -> `--max-model-len=64`; values and single-dash flags stay as they are."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value
