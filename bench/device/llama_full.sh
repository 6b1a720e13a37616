#!/usr/bin/env bash
# Runs THERE (one H200, or an H100 with more of the experts in RAM): issue 38's llama.cpp rows
# at full size, over calls in a row on one warm machine (bench/device/prepare-llama-full.sh
# first, here):
#   1 [.device/llama .device/llama-sdist .device/gpu-4]  Stoke's missing wheels installed;
#      two CUDA builds started, detached: llama-cpp-python (../shared/device's build.sh) and
#      llama.cpp's own llama-server and rpc-server by Stoke's build script (`make
#      llama-tools`' path, flavor cuda, this GPU's architecture only); the full-size DeepSeek V4
#      Flash replica written (`write_deepseek4(mode="full")`: real names, shapes and types,
#      MXFP4 experts, about 148 GiB, sparse: zeros read from a hole; the gpt-2 pre-tokenizer,
#      whose vocabulary load does not crash llama.cpp's CUDA build as DeepSeek's regex did)
#   2 []  waits for both builds (call it again while it says "still building")
#   3 []  `stoke bench engines --engines llama-server --plan --one-at-a-time` on the replica:
#      Stoke's llama.cpp engine beside llama-server, both placed as `stoke plan` places it on
#      this machine, prefill of 4,096 / 32,768 / 65,536 tokens and decode at each depth
#   4 []  `stoke bench kv --anchor llama-server --one-at-a-time --plan --history 32768`: a
#      follow-up after a 32k-token conversation, Stoke keeping its KV beside llama-server with
#      --cache-reuse behind a stateless client, each loaded in turn
# Results in /root/results, copied to $OUT by every call.
source "$(dirname "$0")/common.sh"
export STOKE_BUILD_CACHE=/root/sbc STOKE_LLAMA_FLAVOR=cuda
site=/tmp/site:/tmp/stokesite:$root
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
built() { [ -f /tmp/lcp.done ] && [ -f /tmp/tools.done ]; }
case "${1:-}" in
  1) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stokesite \
       .device/gpu-4/*.whl || exit 2
     mkdir -p "$STOKE_BUILD_CACHE/sdist" && cp .device/llama-sdist/*.tar.gz "$STOKE_BUILD_CACHE/sdist/"
     mkdir -p /root/stash && cp -r .device/llama /root/stash/
     bash /root/stash/llama/build.sh 5 | tail -1
     if [ ! -f /tmp/tools.started ]; then
       touch /tmp/tools.started
       (LLAMA_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${arch}-real" setsid bash -c \
         "PYTHONPATH=$root python3 packaging/llama_build.py tools --python python3 \
          > /tmp/tools.log 2>&1; echo rc=\$? > /tmp/tools.done" &)
     fi
     PYTHONPATH=$site python3 -c "
from app.hardware.synthetic_gguf import write_deepseek4
write_deepseek4('/root/full.gguf', mode='full', tokenizer_pre='gpt-2')" || exit 2
     ls -las /root/full.gguf; df -h /root | tail -1 ;;
  2) for _ in $(seq 1 540); do built && break; sleep 1; done
     built || { echo "still building; call 2 again"; tail -2 /tmp/lcp.log /tmp/tools.log; exit 3; }
     bash /root/stash/llama/build.sh 1 | tail -2
     cat /tmp/tools.done; tail -3 /tmp/tools.log ;;
  3) PYTHONPATH=$site timeout 590 python3 -c "
import argparse, sys
from app.bench import engines
args = argparse.Namespace(model='/root/full.gguf', prompt='4096,32768,65536', decode=32,
                          rounds=2, threads=None, engines='llama-server', one_at_a_time=True,
                          plan=True, json='/root/results/llama-full.json')
sys.exit(engines.main(args))" 2>&1 | tee /root/results/llama-full.log | grep -v '^{' | tail -15 ;;
  4) PYTHONPATH=$site timeout 590 python3 -c "
import argparse, sys
from app.bench import kv
args = argparse.Namespace(model='/root/full.gguf', reps=3, history=32768, only=['follow_up'],
                          engine='llama.cpp', anchor='llama-server', one_at_a_time=True,
                          plan=True, json='/root/results/llama-full-follow-up.json')
sys.exit(kv.main(args))" 2>&1 | tee /root/results/llama-full-follow-up.log | grep -v '^{' | tail -12 ;;
  *) echo "usage: $0 1|2|3|4 (see the top of this file)"; exit 1 ;;
esac
cp /root/results/* "$OUT"/ 2>/dev/null
ls -la "$OUT"
