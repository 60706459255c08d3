#!/usr/bin/env bash
# The checks that need a CUDA device, in one run of at most about nine minutes (a short lease)
# (issues 18 and 19: CUDA-event costs, allocator peaks, the executor on the GPU).
#   bash bench/gpu_check.sh OUTDIR
# Writes OUTDIR/pytest.log, OUTDIR/times.jsonl (predicted autodiff step against eager's, every
# zoo model and the Hugging Face ones, measured costs), OUTDIR/stability.jsonl (two builds,
# the second beside a busy process: Spearman and totals), OUTDIR/peaks/ (predicted autodiff step
# peaks against eager's, with eager's allocator traces) and OUTDIR/paper/ (the paper models at
# GPU sizes: graphs and eager figures; solve them anywhere and run them with bench/paper_gpu.py
# solve / execute). Results: docs/benchmarks.md and docs/results.md.
set -u
out=${1:?usage: bench/gpu_check.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" >> "$out/gpu.txt"
echo "== pytest (CUDA tests)"
timeout 180 python3 -m pytest -q -n 8 --dist load -p no:cacheprovider tests/test_cuda.py \
    tests/test_measurement.py tests/test_model_untouched.py tests/test_cost_models.py \
    > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -n 15 "$out/pytest.log"
echo "== predicted vs eager step (measured costs, CUDA events)"
timeout 100 python3 bench/cost_fidelity.py --device cuda --cost measured --time-only --rounds 15 \
    --json > "$out/times.jsonl" 2> "$out/times.err"
echo "times rc=$?"
echo "== stability (two builds, the second beside a busy process)"
timeout 60 python3 bench/cost_fidelity.py --device cuda --cost measured --stability --json \
    gpt2 resnet unet transformer hf-gpt2 > "$out/stability.jsonl" 2> "$out/stability.err"
echo "stability rc=$?"
echo "== autodiff step peaks against eager's"
timeout 45 python3 bench/peak_trace.py --out "$out/peaks" > /dev/null 2> "$out/peaks.err"
echo "peaks rc=$?"
echo "== paper models at GPU sizes: capture"
timeout 150 python3 bench/paper_gpu.py capture --out "$out/paper" > /dev/null 2> "$out/paper.err"
echo "paper rc=$?"
python3 - "$out" <<'PY'
import json, sys
from pathlib import Path
for name in ("times.jsonl", "stability.jsonl", "peaks/peaks.jsonl", "paper/capture.jsonl"):
    path = Path(sys.argv[1], name)
    for line in path.read_text().splitlines() if path.exists() else ():
        row = json.loads(line)
        keep = ("model", "nodes", "predicted_step_ms", "eager_step_ms", "predicted_over_eager",
                "spearman", "busy_over_quiet", "status", "predicted_step_peak", "eager_step_peak",
                "error")
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k in keep})
PY
