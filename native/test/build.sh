#!/usr/bin/env bash
# Builds the CUDA backend and its smoke program into build/cuda-test (run from anywhere).
# Then, on a machine with 2 GPUs: build/cuda-test/cuda_smoke
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cmake -S "$root/native/test" -B "$root/build/cuda-test" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$root/build/cuda-test" -j "$(nproc)"
echo "built: $root/build/cuda-test/cuda_smoke"
