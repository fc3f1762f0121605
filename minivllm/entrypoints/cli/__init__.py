"""minivllm's command-line applications built on the engine: `python -m minivllm trace` and `trace-serve` (vLLM keeps
its CLI subcommands in vllm/entrypoints/cli/ too)."""
