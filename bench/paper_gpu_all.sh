#!/usr/bin/env bash
# The paper models of bench/paper_gpu.py captured, solved and executed in one GPU lease: the
# solves run on the GPU machine's own cores, one process per model and budget (0.5 and 0.55 of
# the graph's autodiff peak: a whole step can have no schedule at 0.5, as FNO3d's has none,
# docs/results.md), while the CUDA tests run beside them; the executions run after, alone, so
# that their timings see a quiet machine.
#   bash bench/paper_gpu_all.sh OUTDIR MODEL...      (e.g. fno1d fno3d)
# Writes OUTDIR/capture.jsonl and the graphs, OUTDIR/b<budget>/{solve,execute}.jsonl and
# OUTDIR/pytest.log. Each solve may take minutes when they share the machine. Results:
# docs/results.md.
set -u
out=${1:?usage: bench/paper_gpu_all.sh OUTDIR MODEL...}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" >> "$out/gpu.txt"
echo "== capture"
timeout 150 python3 bench/paper_gpu.py capture "$@" --out "$out" > /dev/null 2> "$out/capture.err"
echo "capture rc=$?"
(timeout 200 python3 -m pytest -q -n 4 -p no:cacheprovider tests/test_cuda.py \
    tests/test_measurement.py > "$out/pytest.log" 2>&1; echo "pytest rc=$?" >> "$out/pytest.log") &
echo "== solve"
for model in "$@"; do
    for budget in 0.5 0.55; do
        dir="$out/b$budget"
        mkdir -p "$dir"
        cp "$out/$model.graph" "$dir/" 2>/dev/null || continue
        timeout 400 python3 bench/paper_gpu.py solve "$model" --out "$dir" --budget "$budget" \
            --n-jobs 4 > /dev/null 2> "$dir/$model.solve.err" &
    done
done
wait
tail -n 3 "$out/pytest.log"
echo "== execute"
for budget in 0.5 0.55; do
    dir="$out/b$budget"
    for model in "$@"; do
        if python3 - "$dir/solve.jsonl" "$model" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
sys.exit(0 if any(r["model"] == sys.argv[2] and "error" not in r for r in rows) else 1)
PY
        then
            timeout 90 python3 bench/paper_gpu.py execute "$model" --out "$dir" --budget "$budget" \
                > /dev/null 2> "$dir/$model.execute.err"
            echo "execute $model $budget rc=$?"
        fi
    done
done
for name in capture.jsonl b0.5/solve.jsonl b0.55/solve.jsonl b0.5/execute.jsonl \
        b0.55/execute.jsonl; do
    echo "-- $name"; cut -c1-600 "$out/$name" 2>/dev/null
done
