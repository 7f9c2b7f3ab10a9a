#!/usr/bin/env bash
# Everything a GPU session runs, in one call (the device tool gives 30 minutes, 10 per command): the CUDA tests with
# workers, the rest of the suite, then every GPU benchmark, each writing its benchmarks/results/*_cuda.json.
#
#   bash benchmarks/gpu_checklist.sh [OUT] [tests|bench|all]
#
# Logs go to OUT (default: $OUT, else ./gpu-out); results are copied there too. Set-up needs no package registry
# (make setup links airgraph into a venv that sees the machine's torch: scripts/setup_env.py).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-out}}"
what="${2:-all}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
make setup PYTHON="${PYTHON:-python3}" >"$out/setup.log" 2>&1 || { cat "$out/setup.log"; exit 1; }
py=.venv/bin/python
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $py -c "import torch; print(torch.__version__, torch.version.cuda)"; git rev-parse HEAD; } >"$out/machine.txt" 2>&1

if [[ "$what" != bench ]]; then
    timeout 540 $py -m pytest -q -n 6 -m cuda -p no:cacheprovider >"$out/test-cuda.log" 2>&1
    echo "test-cuda rc=$?" | tee -a "$out/summary.txt"
    timeout 900 $py -m pytest -q -n 12 -m "not cuda" -p no:cacheprovider >"$out/test-not-cuda.log" 2>&1
    echo "test-not-cuda rc=$?" | tee -a "$out/summary.txt"
fi
if [[ "$what" != tests ]]; then
    for bench in "llama_decode.py --preset tiny --output benchmarks/results/llama_decode_tiny_cuda.json" \
                 "llama_decode.py --preset small --output benchmarks/results/llama_decode_small_cuda.json" \
                 "multistream.py" "host_placement.py"; do
        name="${bench%% *}"
        timeout 420 $py benchmarks/$bench >"$out/bench-${name%.py}-$(date +%s).log" 2>&1
        echo "bench $bench rc=$?" | tee -a "$out/summary.txt"
    done
    # HF generate, static cache (#19): 12 cold compiles (3 compiled variants x batch 1, 8 x float32, bfloat16), so a
    # longer limit; it writes partial results after every warm-up and round (complete: false) if cut off. bfloat16
    # tokens that differ from eager only at exact logit ties are accepted (still listed in the JSON).
    timeout 570 $py benchmarks/hf_generate.py --device cuda --preset gpu --accept-ties >"$out/bench-hf_generate-$(date +%s).log" 2>&1
    echo "bench hf_generate.py --device cuda --preset gpu --accept-ties rc=$?" | tee -a "$out/summary.txt"
    cp benchmarks/results/*_cuda*.json "$out/" 2>/dev/null
fi
tail -n 3 "$out"/test-*.log 2>/dev/null | tee -a "$out/summary.txt"
