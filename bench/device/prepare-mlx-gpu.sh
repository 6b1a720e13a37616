#!/usr/bin/env bash
# Run HERE, in the project root (after `echo /.device/ >> .git/info/exclude`). Prepares what
# bench/device/mlx_gpu.sh needs on the H200 machine, which has no package registry and takes
# at most 64 MiB along per call: the MLX CUDA wheel (two halves, ../shared/device), the
# llama-cpp-python source (built there with CUDA), the default model in four parts, and the
# pure-Python packages Stoke and its e2e tests import that the machine lacks, spread over the
# calls `bash bench/device/mlx_gpu.sh 1-4` make there (its top lists what each carries; call 5
# carries nothing), each part sized to fit beside what that call carries.
set -euo pipefail
shared=${SHARED_DEVICE:-../shared/device}
[ -f .device/mlx-a/stash.sh ] && [ -f .device/mlx-b/install.sh ] || bash "$shared/prepare-mlx-cuda.sh"
[ -f .device/llama/build.sh ] || bash "$shared/prepare-llama-cuda.sh"
model=$(${PY:-.venv/bin/python} -c "from app.models.default import default_model_path; print(default_model_path())")
for n in 1 2 3 4; do rm -rf ".device/gpu-$n"; mkdir -p ".device/gpu-$n"; done
# Parts in MiB: 1 beside mlx-a + llama, 2 beside mlx-b, 3 alone, 4 (the rest) beside the wheels.
dd if="$model" of=.device/gpu-1/model.part.1 bs=1M count=4 status=none
dd if="$model" of=.device/gpu-2/model.part.2 bs=1M skip=4 count=18 status=none
dd if="$model" of=.device/gpu-3/model.part.3 bs=1M skip=22 count=58 status=none
dd if="$model" of=.device/gpu-4/model.part.4 bs=1M skip=80 status=none
basename "$model" > .device/gpu-4/MODEL_NAME
(cd "$(dirname "$model")" && sha256sum "$(basename "$model")") > .device/gpu-4/MODEL_SHA256
py="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps $py -d .device/gpu-4 \
  platformdirs==4.14.9 gguf==0.19.0 keyring==25.7.0 jaraco.classes==3.4.0 jaraco.context==6.1.2 \
  jaraco.functools==4.6.0 more-itertools==11.2.1 llguidance==1.9.1 openai==3.57.0 distro==1.9.0 \
  jiter==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 \
  truststore==0.10.5 anyio==4.16.0 idna==3.20 h11==0.16.0
du -sh .device/mlx-a .device/llama .device/gpu-1 .device/mlx-b .device/gpu-2 .device/gpu-3 .device/gpu-4
