#!/usr/bin/env bash
# Run HERE, in the project root, before bench/device/llama_full.sh's first call: the
# llama-cpp-python source for its CUDA build (../shared/device's .device/llama), the same
# source as the sdist Stoke's build script reads (.device/llama-sdist: the trimmed source under
# the sdist's own name, 8 MB where the registry's is 77 MB), and Stoke's missing pure-Python
# wheels (.device/gpu-4, bench/device/prepare-mlx-gpu.sh).
set -euo pipefail
shared=${SHARED_DEVICE:-../shared/device}
[ -f .device/llama/build.sh ] || bash "$shared/prepare-llama-cuda.sh"
[ -d .device/gpu-4 ] || bash bench/device/prepare-mlx-gpu.sh
version=$(${PY:-.venv/bin/python} -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
tmp=$(mktemp -d)
mkdir -p "$tmp/llama_cpp_python-$version" .device/llama-sdist
tar -C "$tmp/llama_cpp_python-$version" -xJf .device/llama/llama-cpp-python-src.tar.xz
tar -C "$tmp" -czf ".device/llama-sdist/llama_cpp_python-$version.tar.gz" "llama_cpp_python-$version"
rm -rf "$tmp"
du -sh .device/llama .device/llama-sdist .device/gpu-4
