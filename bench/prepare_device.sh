#!/usr/bin/env bash
# bench/prepare_device.sh: run here (a machine with the package registries) before a device-suite
# call. Copies the doctest header into .device/deps (the GPU machine has no registry) and, unless
# --no-build, prebuilds the CUDA tests and GPU benchmarks for sm_90a into .device/build so that
# the device's time is spent running, not compiling (OCTET_SUITE_FILTER=<regex> limits the targets).
# It also downloads the peers' wheels the GPU machine lacks into .whl (torchao, about 3 MB: the
# Float8Linear peer of bench/gpu/linear_peers.py; a failed download only leaves that peer skipped).
# Then call the device tool with carry [".device/bin", ".device/deps", ".whl"] and the command:
#   bench/device_suite.sh
set -eu
cd "$(dirname "$0")/.."
mkdir -p .device/deps/doctest .whl
cp /usr/include/doctest/doctest.h .device/deps/doctest/doctest.h
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl torchao==0.18.0 ||
  echo "prepare_device: torchao not downloaded; linear_peers.py will report it skipped"
if [ "${1:-}" != "--no-build" ]; then
  cmake -S . -B .device/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DOCTET_BUILD_TESTS=ON -DOCTET_BUILD_BENCHMARKS=ON -DOCTET_BUILD_EXAMPLES=ON \
    -DOCTET_DOCTEST_DIR="$PWD/.device/deps" >/dev/null
  targets=$(cmake --build .device/build --target help | grep -oE '(test_cuda_|gpubench_)[A-Za-z0-9_]+' | sort -u | grep -E "${OCTET_SUITE_FILTER:-.}")
  if echo training_cuda | grep -qE "${OCTET_SUITE_FILTER:-.}"; then targets="$targets example_08_training"; fi
  cmake --build .device/build --target $targets
  # A slim copy of just the binaries: carry .device/bin and .device/deps (well under 64 MiB).
  rm -rf .device/bin && mkdir -p .device/bin/tests .device/bin/bench .device/bin/examples
  cp .device/build/tests/test_cuda_* .device/bin/tests/ 2>/dev/null || true
  cp .device/build/bench/gpubench_* .device/bin/bench/ 2>/dev/null || true
  cp .device/build/examples/example_08_training .device/bin/examples/ 2>/dev/null || true
  du -sh .device/bin
fi
