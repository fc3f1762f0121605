"""The C sources of minivllm's compiled ops, and the code that builds them (build.py)."""
