#!/usr/bin/env bash
# The one prepared device run: every CUDA path (gpu_check.py), `redline demo` naive → tuned on
# the built-in workloads, then `redline tune` with torch.compile on the lm workload, on the GPU.
# Meant for a lent GPU machine whose image has PyTorch but not every redline dependency: wheels
# for the missing ones (orjson, ijson, lmdb) travel in .whl/ (docs/tune.md, "Checking on a
# GPU"). Writes logs under $OUT (or ./gpu-out when $OUT is unset). About 5-8 minutes on an H200;
# give the device call a timeout of ~580 s.
#
#   bash benchmarks/gpu_session.sh
set -u
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
timeout 180 python3 benchmarks/gpu_check.py 2>&1 | tee "$OUT/gpu_check.txt"
# Most telling first (a run cut short by its time limit still returns what it wrote):
# vision-large is the GPU-sized workload whose tuned device busy (kernels) is the target;
# vision's loader autotune may now ramp past 6 workers on 16 cores (whole-epoch trials).
for w in vision-large vision lm; do
  timeout 240 python3 -m redline.cli.main demo --workload "$w" --steps 40 \
    --json "$OUT/demo_$w.json" 2>&1 | tee "$OUT/demo_$w.txt"
done
timeout 150 python3 -m redline.cli.main tune benchmarks/tune_lm_setup.py --run-steps 100000 \
  --plan "$OUT/plan_lm.json" --fresh 2>&1 | tee "$OUT/tune_lm_compile.txt"
