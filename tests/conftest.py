"""Shared fixtures: the real SmolLM2 checkpoint, tiny random Llama/OPT models, and HF greedy references."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

# Eight prompts of different lengths, submitted together in the parity tests.
PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "Hi there, how are you today?",
    "Write a haiku about the sea.",
    "In a paged KV cache, every request owns a list of physical blocks, and the block table maps each "
    "logical block to one of them, much like a page table in an operating system.",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):",
]


@pytest.fixture(scope="session")
def smollm_folder():
    from minivllm.models.loader import resolve_model
    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(smollm_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm_folder)


def _save_tiny(folder, config, smollm_folder):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm_folder / name).exists():
            shutil.copy(smollm_folder / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory, smollm_folder):
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    return _save_tiny(tmp_path_factory.mktemp("tiny-llama"), config, smollm_folder)


@pytest.fixture(scope="session", params=["pre-norm", "post-norm-projected"])
def tiny_opt_folder(request, tmp_path_factory, smollm_folder):
    from transformers import OPTConfig
    pre = request.param == "pre-norm"
    config = OPTConfig(vocab_size=49152, hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                       max_position_embeddings=512, word_embed_proj_dim=64 if pre else 32,
                       do_layer_norm_before=pre, init_std=0.2, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    return _save_tiny(tmp_path_factory.mktemp(f"tiny-opt-{request.param}"), config, smollm_folder)


def hf_greedy(folder, prompt_token_ids: list[list[int]], max_new_tokens: int, eos_token_id: int = 2) -> list[list[int]]:
    """HF transformers' own greedy generate(), one prompt at a time (no padding to perturb numerics)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompt_token_ids:
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos_token_id, pad_token_id=eos_token_id)
            outs.append(out[0, len(ids):].tolist())
    return outs


def check_logprobs_close(a_runs, b_runs, a_name: str, b_name: str) -> int:
    """vLLM's check_logprobs_close over runs of (token ids, [set of top-k ids per position]): where two runs
    first choose different tokens, each choice must be in the other's top k (the rest of that prompt is not
    compared: its context now differs). Returns how many prompts agreed on every token."""
    identical = 0
    for i, ((a_tok, a_top), (b_tok, b_top)) in enumerate(zip(a_runs, b_runs)):
        for pos, (x, y) in enumerate(zip(a_tok, b_tok)):
            if x != y:
                assert x in b_top[pos] and y in a_top[pos], (
                    f"prompt {i}, position {pos}: {a_name} chose {x}, {b_name} chose {y}, and one is not in "
                    f"the other's top {len(a_top[pos])} ({a_name}: {sorted(a_top[pos])}, {b_name}: "
                    f"{sorted(b_top[pos])})")
                break
        else:
            identical += 1
    return identical


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def start_chromium(window_size: str, page_load_timeout: int):
    """Debian's headless Chromium through its chromedriver, with a profile folder of its own that ``quit_chromium``
    removes: without ``--user-data-dir`` every browser left an ``org.chromium.Chromium.*`` folder in /tmp."""
    import tempfile
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    profile = tempfile.mkdtemp(prefix="minivllm-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={window_size}", "--no-first-run", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    except BaseException:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    driver.set_page_load_timeout(page_load_timeout)  # bounds a hang only: a busy machine loads a page slowly
    driver.minivllm_profile = profile
    return driver


def quit_chromium(driver) -> None:
    try:
        driver.quit()
    finally:
        shutil.rmtree(driver.minivllm_profile, ignore_errors=True)
