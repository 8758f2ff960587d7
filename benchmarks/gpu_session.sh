#!/usr/bin/env bash
# The prepared device runs, in two parts that each fit one device call (≤ 600 s):
#   bash benchmarks/gpu_session.sh 1   # demo vision-large (the GPU target), then gpu_check.py
#   bash benchmarks/gpu_session.sh 2   # demo lm-large, then `redline tune` lm with compile
#   bash benchmarks/gpu_session.sh 3   # gpu_check.py alone (~40 s)
# Part 1 first: it holds the GPU target (the tuned vision-large's "device busy (kernels)").
# Meant for a lent GPU machine whose image has PyTorch but not every redline
# dependency: wheels for the missing ones (orjson, ijson, lmdb) travel in .whl/ (docs/tune.md,
# "Checking on a GPU"); carry `.whl` and give the call a timeout of ~580 s. Logs go under $OUT
# (or ./gpu-out when $OUT is unset). A step cut by its own timeout still leaves its log.
set -u
part="${1:-1}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/redline-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/redline-site:src"
else
  export PYTHONPATH="src"
fi
export PYTHONUNBUFFERED=1 REDLINE_CACHE_DIR="$OUT/cache"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
demo() {  # workload, time limit (s)
  timeout "$2" python3 -m redline.cli.main demo --workload "$1" --steps 20 \
    --json "$OUT/demo_$1.json" > "$OUT/demo_$1.txt" 2>&1
  echo "demo $1: exit $?"
  grep -E "still limited|device busy|device span|throughput \(|data wait +│|MFU|  [a-z].*: .* samples/s" \
    "$OUT/demo_$1.txt"
}
check() {
  timeout 120 python3 benchmarks/gpu_check.py > "$OUT/gpu_check.txt" 2>&1
  echo "gpu_check: exit $?"
  grep -E "^\|" "$OUT/gpu_check.txt"
}
if [ "$part" = 1 ]; then
  demo vision-large 400
  check
elif [ "$part" = 3 ]; then
  check
else
  demo lm-large 300
  timeout 150 python3 -m redline.cli.main tune benchmarks/tune_lm_setup.py --run-steps 100000 \
    --plan "$OUT/plan_lm.json" --fresh > "$OUT/tune_lm_compile.txt" 2>&1
  echo "tune lm with compile: exit $?"
  grep -E "torch.compile|throughput \(|device busy" "$OUT/tune_lm_compile.txt"
fi
