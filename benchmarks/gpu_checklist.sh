#!/usr/bin/env bash
# Everything a GPU session runs, in one device call: the CUDA tests, then the GPU benchmarks, each writing its
# benchmarks/results/*_cuda.json.
#
#   bash benchmarks/gpu_checklist.sh [OUT] [quick|roofline|serving|cuda|tests|bench|all|followup|tuning|warmstart]
#
# quick (the default) fits a 15-minute lease with a minute or two to start the machine: one call that BUDGET bounds,
# run with the device tool's timeout_s=600; BUDGET (seconds, default 560) is when quick mode must be done. First the
# LLM roofline (#33, benchmarks/llm_roofline.py, bf16, all into llm_roofline_cuda.json, logged into the one file
# OUT/llm_roofline.log): 1b at batch 1 (eager, torch.compile reduce-overhead, airgraph reduce-overhead, airgraph
# default), 1b at batch 8, the other variants at both, then 8b at batch 1; each a process of its own with a time
# limit, skipped when too little of BUDGET is left. Then the serving benchmark (#34, benchmarks/serving_batches.py:
# 1b, batches of 1..64 with and without capture sizes, serving_batches_cuda.json written after every variant) if
# 150 s are left. Then, as BUDGET allows, the CUDA tests and the decode benchmark
# on both presets twice (a figure from one run is a sample; the second runs write
# llama_decode_{tiny,small}_cuda_run2.json), each run getting at most what is left and none under 100 s. roofline:
# the roofline steps alone; serving: the serving benchmark alone, in BUDGET; cuda: the rest of quick without the
# roofline and the serving benchmark (a second call). all adds the rest of the suite,
# the multistream and host-placement benchmarks and HF generate at batches 1 and 8 (about 40 minutes: several
# calls, `tests` then `bench`). followup, a second call on the same lease: HF generate on the 1b preset (bf16,
# batch 1: hf_generate_1b_cuda.json), at batch 8, then at batch 1 with in-graph input copies beside airgraph's
# default and torch.compile reduce-overhead (hf_generate_batch8_cuda.json, hf_generate_in_graph_cuda.json), in BUDGET.
# After the decode benchmark (quick, cuda: if 240 s of BUDGET are left), and alone after the tuning cuda tests in
# tuning mode (in BUDGET): tuning on the GPU (#36, benchmarks/tuning.py --device cuda: the 1B preset's decode step
# and a prefill op-tuned in reduce-overhead against untuned in a fresh process, tuning_cuda.json after each model).
# warmstart (alone, in BUDGET; also in `all`): the warm start on CUDA (#35, benchmarks/warm_start.py --device cuda:
# the small preset's reduce-overhead decode, fresh processes cold and warm, first replayed step from process start
# against eager's first step; warm_start_cuda.json).
#
# The device tool returns at most 8 files from OUT, and nothing written after it kills a call: after every step the
# logs and the result files written so far are packed again into OUT/gpu-run.tgz, and OUT/summary.txt (also
# printed) says how each step ended. Set-up needs no package registry (make setup links airgraph into a venv that
# sees the machine's torch: scripts/setup_env.py; pip is told there is no index, so it fails at once, not after
# retries); if it fails anyway, the steps run airgraph from the checkout (PYTHONPATH) with the machine's python.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-out}}"
what="${2:-quick}"
budget="${BUDGET:-560}"
mkdir -p "$out"
logs=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX")/gpu-run  # outside OUT: only the packed copy goes back
mkdir -p "$logs"
start=$(date +%s)
touch "$logs/.start"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The H200 machine's default CXX (a wrapper) builds AOTInductor packages that crash when loaded; its g++ works
# (README, "Load probe").
command -v g++ >/dev/null && export CXX=g++
# torch keeps CUPTI loaded between profiler sessions only when Inductor's cudagraphs flag is on; the decode
# benchmark profiles three variants next to live CUDA graphs
export TEARDOWN_CUPTI=0
pack() {  # the logs and the result files written since the start, into OUT/gpu-run.tgz
    find benchmarks/results -name '*_cuda*.json' -newer "$logs/.start" -exec cp {} "$logs/" \; 2>/dev/null
    tar -czf "$out/gpu-run.tgz.part" -C "$(dirname "$logs")" gpu-run && mv "$out/gpu-run.tgz.part" "$out/gpu-run.tgz"
}
step() {  # step NAME SECONDS COMMAND...: run it with a time limit, log to gpu-run/NAME.log, note how it ended
    local name=$1 limit=$2
    shift 2
    timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
    echo "$name rc=$? at $(($(date +%s) - start)) s" | tee -a "$out/summary.txt"
    pack
}
budget_left() { echo $((budget - ($(date +%s) - start))); }
# roofline NAME SECONDS LEAST ARGS...: benchmarks/llm_roofline.py on CUDA with ARGS, added (--append) to
# llm_roofline_cuda.json, logged into the one file OUT/llm_roofline.log; outside `all`, at most what is left of
# BUDGET, and skipped under LEAST seconds. Each call writes its rows after every variant and round, so one cut
# short keeps what it measured.
roofline() {
    local name=$1 limit=$2 least=$3 now
    shift 3
    now=$(budget_left)
    if [[ "$what" != all ]] && ((now < least)); then
        echo "$name skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
        return
    fi
    [[ "$what" != all ]] && ((now < limit)) && limit=$now
    echo "== $name: llm_roofline.py $* (limit ${limit} s, at $(($(date +%s) - start)) s)" >>"$out/llm_roofline.log"
    timeout -k 10 "$limit" $py benchmarks/llm_roofline.py --device cuda --append \
        --output benchmarks/results/llm_roofline_cuda.json "$@" >>"$out/llm_roofline.log" 2>&1
    echo "$name rc=$? at $(($(date +%s) - start)) s" | tee -a "$out/summary.txt"
    cp benchmarks/results/llm_roofline_cuda.json "$out/" 2>/dev/null
    cp "$out/llm_roofline.log" "$logs/"
    pack
}
# tuning_bench SECONDS LEAST: benchmarks/tuning.py --device cuda (#36); outside `all`, at most what is left of BUDGET,
# and skipped under LEAST seconds. It writes tuning_cuda.json after each model, so one cut short keeps what it measured.
tuning_bench() {
    local limit=$1 least=$2 now
    now=$(budget_left)
    if [[ "$what" != all ]] && ((now < least)); then
        echo "tuning-cuda skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
        return
    fi
    [[ "$what" != all ]] && ((now < limit)) && limit=$now
    step tuning-cuda "$limit" $py benchmarks/tuning.py --device cuda --output benchmarks/results/tuning_cuda.json
}
if make setup PYTHON="${PYTHON:-python3}" >"$logs/setup.log" 2>&1; then
    py=.venv/bin/python
else
    echo "make setup failed (gpu-run/setup.log): airgraph from the checkout" | tee -a "$out/summary.txt"
    py="${PYTHON:-python3}"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; $py -c "import torch; print(torch.__version__, torch.version.cuda)"; git rev-parse HEAD; } >"$logs/machine.txt" 2>&1
pack

if [[ "$what" == followup ]]; then
    # HF generate on Llama-3.2-1B's shapes (#33's end-to-end target): bf16, batch 1, 256 new tokens
    step hf_generate-1b $((budget / 2)) $py benchmarks/hf_generate.py --device cuda --preset 1b --accept-ties \
        --dtypes bfloat16 --batches 1 --output benchmarks/results/hf_generate_1b_cuda.json
    now=$(budget_left)
    if ((now >= 90)); then
        step hf_generate-batch8 $((now < budget / 2 ? now : budget / 2)) $py benchmarks/hf_generate.py --device cuda \
            --preset gpu --accept-ties --batches 8 --output benchmarks/results/hf_generate_batch8_cuda.json
    else
        echo "hf_generate-batch8 skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
    fi
    now=$(budget_left)
    if ((now >= 90)); then
        step hf_generate-in-graph "$now" $py benchmarks/hf_generate.py --device cuda --preset gpu --accept-ties \
            --batches 1 --output benchmarks/results/hf_generate_in_graph_cuda.json \
            --variants "torch.compile reduce-overhead,airgraph reduce-overhead,airgraph in-graph input copies"
    else
        echo "hf_generate-in-graph skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
    fi
    pack
    exit 0
fi
if [[ "$what" == warmstart ]]; then
    step warm_start-cuda "$budget" $py benchmarks/warm_start.py --device cuda --rounds 2 \
        --output benchmarks/results/warm_start_cuda.json
    pack
    exit 0
fi
if [[ "$what" == tuning ]]; then
    step test-cuda-tuning 240 $py -m pytest -q -m cuda tests/tuning -p no:cacheprovider -rfE --tb=short
    tuning_bench "$budget" 240
    tail -n 3 "$logs"/test-*.log 2>/dev/null | tee -a "$out/summary.txt"
    pack
    exit 0
fi
if [[ "$what" != tests && "$what" != cuda && "$what" != serving ]]; then
    # The LLM roofline first (#33's GPU time): 1b at batch 1, then batch 8, then the other variants, then 8b
    core="eager,torch.compile reduce-overhead,airgraph reduce-overhead,airgraph default"
    roofline llm_roofline-1b-batch1 300 90 --preset 1b --batch 1 --variants "$core" --profile
    roofline llm_roofline-1b-batch8 300 90 --preset 1b --batch 8 --variants "$core"
    roofline llm_roofline-1b-others 300 90 --preset 1b --batch 1 8 --variants "torch.compile default,airgraph fast path,airgraph frozen parameters,airgraph in-graph input copies"
    roofline llm_roofline-8b-batch1 360 150 --preset 8b --batch 1 --variants "$core"
fi
[[ "$what" == roofline ]] && exit 0
if [[ "$what" == quick || "$what" == serving || "$what" == bench || "$what" == all ]]; then
    # The serving benchmark next (#34): its variants one after another (torch.compile's dynamic=False, a compile per
    # batch size, last); outside `all`, at most what is left of BUDGET and skipped under 150 s
    limit=570 now=$(budget_left)
    if [[ "$what" != all ]] && ((now < 150)); then
        echo "serving_batches skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
    else
        [[ "$what" != all ]] && ((now < limit)) && limit=$now
        step serving_batches $limit $py benchmarks/serving_batches.py --device cuda --preset 1b \
            --output benchmarks/results/serving_batches_cuda.json
    fi
fi
[[ "$what" == serving ]] && exit 0
if [[ "$what" != bench ]]; then
    limit=200 now=$(budget_left)
    [[ "$what" == quick || "$what" == cuda ]] && ((now < limit)) && limit=$now
    if [[ "$what" == quick || "$what" == cuda ]] && ((now < 100)); then
        echo "test-cuda skipped: ${now} s left of the ${budget} s budget" | tee -a "$out/summary.txt"
    else
        step test-cuda $limit $py -m pytest -q -n 8 -m cuda -p no:cacheprovider -rfE --tb=short
    fi
    [[ "$what" == quick || "$what" == cuda ]] ||
        step test-not-cuda 900 $py -m pytest -q -n 12 -m "not cuda" -p no:cacheprovider -rfE
fi
if [[ "$what" != tests ]]; then
    for run in 1 2; do
        suffix=$([[ $run == 2 ]] && echo _run2)
        for preset in tiny small; do
            limit=200 left=$((budget - ($(date +%s) - start)))
            if [[ "$what" == quick || "$what" == cuda ]] && ((left < 100)); then
                echo "llama_decode-$preset$suffix skipped: ${left} s left of the ${budget} s budget" \
                    | tee -a "$out/summary.txt"
                continue
            fi
            [[ "$what" == quick || "$what" == cuda ]] && ((left < limit)) && limit=$left
            step "llama_decode-$preset$suffix" $limit $py benchmarks/llama_decode.py --preset $preset \
                --output benchmarks/results/llama_decode_${preset}_cuda$suffix.json
        done
    done
    tuning_bench 600 240
    if [[ "$what" != quick && "$what" != cuda ]]; then
        step multistream 420 $py benchmarks/multistream.py
        step host_placement 420 $py benchmarks/host_placement.py
        step warm_start-cuda 600 $py benchmarks/warm_start.py --device cuda --rounds 2 \
            --output benchmarks/results/warm_start_cuda.json
        # HF generate, static cache (#19): a cold compile per compiled variant, batch and dtype; it writes partial
        # results after every warm-up and round (complete: false) if cut off. bfloat16 tokens that differ from
        # eager only at exact logit ties are accepted (still listed in the JSON).
        step hf_generate 570 $py benchmarks/hf_generate.py --device cuda --preset gpu --accept-ties --batches 1,8
    fi
fi
tail -n 3 "$logs"/test-*.log 2>/dev/null | tee -a "$out/summary.txt"
pack
