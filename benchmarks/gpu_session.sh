#!/usr/bin/env bash
# The prepared device run: one call of a lent GPU machine (give it a timeout of ~590 s):
#   bash benchmarks/gpu_session.sh        # gpu_check.py, then demo vision-large, then lm-large
#   bash benchmarks/gpu_session.sh check  # gpu_check.py alone (~60-90 s)
#   bash benchmarks/gpu_session.sh vision # demo vision-large alone (--allow-batch-change)
#   bash benchmarks/gpu_session.sh lm     # demo lm-large alone
#   bash benchmarks/gpu_session.sh short  # the GPU decode, small-batch and trace rows, then
#                                         # redline tune on vision-large, one round (~300 s)
# Each step has its own time limit, so a slow one leaves the rest their time and its log.
# Meant for a GPU image with PyTorch and torchvision but not every redline dependency:
# wheels for the missing ones (orjson, ijson, lmdb) travel in .whl/ (docs/tune.md, "Checking
# on a GPU"); carry `.whl`. Logs go under $OUT (or ./gpu-out when $OUT is unset).
set -u
part="${1:-all}"
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/redline-site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/redline-site:src"
else
  export PYTHONPATH="src"
fi
export PYTHONUNBUFFERED=1 REDLINE_CACHE_DIR=/tmp/redline-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'torchvision', torchvision.__version__)"
demo() {  # workload, time limit (s), extra flags
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m redline.cli.main demo --workload "$name" --steps 12 "$@" \
    --json "$OUT/demo_$name.json" > "$OUT/demo_$name.txt" 2>&1
  echo "demo $name $*: exit $? after $((SECONDS - t0)) s"
  grep -E "still limited|device busy|device span|throughput|MFU|energy|GPU decode|kept|  [a-z].*: .* samples/s" \
    "$OUT/demo_$name.txt" | cut -c1-220
}
check() {
  local t0=$SECONDS
  timeout 170 python3 benchmarks/gpu_check.py > "$OUT/gpu_check.txt" 2>&1
  echo "gpu_check: exit $? after $((SECONDS - t0)) s"
  grep -E "^\||Traceback|Error" "$OUT/gpu_check.txt" | cut -c1-400
}
tune_vision() {  # time limit (s)
  local t0=$SECONDS
  timeout "$1" python3 -m redline.cli.main tune benchmarks/tune_vision_large_setup.py \
    --no-compile --allow-batch-change --fresh --rounds 1 --plan /tmp/plan_vision.json \
    --json "$OUT/tune_vision-large.json" > "$OUT/tune_vision-large.txt" 2>&1
  echo "tune vision-large: exit $? after $((SECONDS - t0)) s"
  cut -c1-260 "$OUT/tune_vision-large.txt" | grep -vE "^ *$"
}
case "$part" in
  check) check ;;
  short)
    timeout 60 python3 benchmarks/gpu_check.py --only "GPU decode" "small batch" "trace of" \
      > "$OUT/gpu_check_rows.txt" 2>&1
    grep -E "^\||Traceback|Error" "$OUT/gpu_check_rows.txt" | cut -c1-400
    tune_vision 235 ;;
  vision) demo vision-large 400 --allow-batch-change ;;
  lm) demo lm-large 300 ;;
  *) check; demo vision-large 250 --allow-batch-change; demo lm-large 150 ;;
esac
