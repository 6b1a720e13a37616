#!/usr/bin/env bash
# Runs THERE (the H200 machine): the MLX engine on the GPU beside llama.cpp CUDA (issue 20),
# and the MLX DeepSeek V4 MTP decode rows (issue 18). bench/device/prepare-mlx-gpu.sh (run
# here first) splits what it needs over the calls `bash bench/device/mlx_gpu.sh N` makes, in a
# row on one warm machine (each call takes at most 64 MiB along), with these folders carried:
#   1 [.device/mlx-a .device/llama .device/gpu-1]  stash them, start the llama.cpp CUDA build
#                                                  (detached, ~5 min; later calls go on meanwhile)
#   2 [.device/mlx-b .device/gpu-2]                install MLX (CUDA 13), stash
#   3 [.device/gpu-3]                              stash
#   4 [.device/gpu-4]                              join the default model, install Stoke's
#      missing pure-Python packages, then app/bench/mlx_gpu.py: the GPU checks and prefill/decode
#      tok/s of MLX vs llama.cpp CUDA on the same two files, each engine in its own process
#      (both wait for the build first: it takes every core)
#   5 []  the e2e engine suite's core on the MLX backend (five follow-up turns prefill only
#      their new tokens, edits trim, snapshots round-trip through disk, RAM and resident
#      sequences, cancel and preemption; the default model kept quantized on the GPU; the
#      DeepSeek V4 scaled model's engine turns), added to the results; then app/bench/mtp_decode.py
#      on the MLX DeepSeek V4 with its MTP head (gpu preset)
# Results build up in /root/results and each call copies them to $OUT: mlx-engine-h200.json/.md,
# bench.log, e2e-mlx-gpu.xml/.log, mtp-decode.json, mtp.log.
# MLX runs in processes that cannot import llama.cpp (its CUDA build is kept off their
# PYTHONPATH): the two CUDA stacks crashed when one process held both.
source "$(dirname "$0")/common.sh"
mlx_path=/tmp/stokesite:/tmp/mlxsite:/tmp/llm:$root
case "${1:-}" in
  1) stash .device/mlx-a && stash .device/gpu-1 && mkdir -p /root/stash/llama \
       && cp .device/llama/* /root/stash/llama/ && bash /root/stash/llama/build.sh 15
     nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
     exit 0 ;;
  2) bash .device/mlx-b/install.sh && stash .device/gpu-2; tail -2 /tmp/lcp.log; exit ;;
  3) stash .device/gpu-3; tail -2 /tmp/lcp.log; exit ;;
  4|5) ;;
  *) echo "usage: $0 1|2|3|4|5 (see the top of this file)"; exit 1 ;;
esac
if [ "$1" = 4 ]; then
  join_default_model || exit 2
  PYTHONPATH=$mlx_path python3 -c "import mlx.core as mx; assert mx.cuda.is_available(); \
print('mlx', mx.__version__, mx.default_device())" || { echo "no MLX CUDA: call 2 first"; exit 4; }
  # The build uses every core, and MLX's kernel compiles (NVRTC, on first use: 100-125 s for
  # the default model's first forward on a fresh machine) are CPU-bound: on 2026-12-01 the MLX
  # stage overlapped the build's last 4 minutes and its SmolLM decode runs read 86, 52 and 204
  # tok/s, compiles included. So the timings wait for it.
  for _ in $(seq 1 400); do [ -f /tmp/lcp.done ] && break; sleep 1; done
  bash /root/stash/llama/build.sh 1 | tail -1
  # MLX caches the compiled kernels under /tmp/mlx for the later processes and calls here
  PYTHONPATH=$mlx_path timeout 330 python3 -m app.bench.mlx_gpu --out /root/results --stages mlx \
    --scratch /root/scratch --limits 320,150 2>&1 | tee /root/results/bench.log
  # which import order llama.cpp's CUDA build survives, each in a fresh process
  for first in numpy llama_cpp; do
    PYTHONPATH=/tmp/site:$mlx_path python3 -c "import $first, numpy, llama_cpp
from app.engine.llamacpp.backend import load_vocab
from app.models.default import default_model_path
print(len(load_vocab(str(default_model_path())).tokenize('Hello 123')))" > /dev/null 2>&1
    echo "llama.cpp vocab load with $first imported first: exit status $?" \
      | tee -a /root/results/bench.log
  done
  PYTHONPATH=/tmp/site:$mlx_path timeout 170 python3 -m app.bench.mlx_gpu --out /root/results \
    --stages llama.cpp --scratch /root/scratch 2>&1 | tee -a /root/results/bench.log
else
  PYTHONPATH=$mlx_path timeout 270 python3 -m pytest -q -p no:cacheprovider \
    --timeout 120 --durations=0 -rA -k "mlx or deepseek" \
    tests/e2e/test_turns.py tests/e2e/test_snapshots.py tests/e2e/test_host.py \
    tests/e2e/test_deepseek_v4_engine.py --junitxml=/root/results/e2e-mlx-gpu.xml \
    > /root/results/e2e-mlx-gpu.log 2>&1
  tail -25 /root/results/e2e-mlx-gpu.log
  PYTHONPATH=$mlx_path python3 -m app.bench.mlx_gpu --out /root/results --stages none \
    --junit /root/results/e2e-mlx-gpu.xml | tail -3
  PYTHONPATH=$mlx_path timeout 270 python3 -m app.bench.mtp_decode --preset gpu --engines mlx \
    --reps 5 --tokens 256 --out /root/results 2>&1 | tee /root/results/mtp.log | tail -20
fi
cp /root/results/* "$OUT"/ 2>/dev/null
ls -la "$OUT"
