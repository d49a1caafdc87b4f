#!/usr/bin/env bash
# bench/device_suite.sh: octet's device suite. On a machine with a Hopper GPU (and no package
# registry), it builds the CUDA tests and GPU benchmarks for sm_90a, runs every `gpu` and `cuda`
# test suite and every GPU benchmark, and prints one summary table.
#
#   bench/prepare_device.sh            # here, once: copies the doctest header into .device/deps,
#                                      # and prebuilds .device/build (optional, saves device time)
#   bench/device_suite.sh              # there, from the repository root (carry .device/bin, .device/deps)
#
# Options (environment): OCTET_SUITE_BUILD=<dir> (default .device/bin, the prebuilt binaries
# prepare_device.sh leaves, else .device/build; reused when its binaries run there, else rebuilt), OCTET_SUITE_OUT=<dir> (logs; default .device/out; when $OUT is
# set, as on the lent machine, the logs are also archived to $OUT/device_logs.tgz),
# OCTET_SUITE_FILTER=<regex> (run only matching test/bench binaries).
#
# Every tests/cuda suite is found by its binary name (test_cuda_*). Checks that only a device can make:
#   graph_capture   a training step (quantize, scaled GEMM, attention fwd/bwd, AdamW) with a lent
#                   allocator captured into a CUDA graph (global capture mode) and replayed bit for bit
#                   against the eager step; the scratch queries equal the allocator's requests
#                   (OCTET_SUITE_FILTER=graph_capture runs it alone)
#   torch_cuda      the torch ops' CUDA kernels (tests/python/test_cuda.py: quantize, dequantize,
#                   scaled_mm, AdamW, Float8Linear's ops, attention, the codec): the op libraries are
#                   built there against that machine's torch (its C++ ABI is the one that loads them),
#                   with OCTET_TORCH_CUDA=ON, into .device/pybuild; then the test module runs with
#                   OCTET_REQUIRE_CUDA=1 (a library without CUDA kernels fails instead of skipping)
#   comm_nccl_sharded  the NCCL reduce-scatter and quantized all-gather (comm/nccl_sharded.cuh)
#                   against the host versions, bit for bit, one rank per GPU (up to 4), beside
#                   codec_nccl (the NCCL all-reduce); UNVERIFIED until a GPU (two for NCCL) has run
#                   it (OCTET_SUITE_FILTER=nccl runs them all)
#   nn_moe_nccl     the expert-parallel MoE exchange over NCCL (comm/nccl_moe.cuh: plan, dispatch, rows,
#                   combine) against the host exchange, bit for bit, one rank per GPU; UNVERIFIED too
#   training_cuda   examples/08_training with its FP8 linears on the GPU (--linears cuda) against the
#                   same 30-step runs on the host (cuda_matches_host.py: every loss within 0.02 nats)
# Peers in Python (bench/gpu/*.py, each a line per result), among them linear_peers.py: Float8Linear
# against torchao's Float8Linear and nn.Linear in bf16, scaled_mm against torch._scaled_mm (it loads
# the op libraries that torch_cuda built; torchao travels in .whl, see bench/prepare_device.sh).
set -u
cd "$(dirname "$0")/.."
if [ -z "${OCTET_SUITE_BUILD:-}" ] && [ -d .device/bin ]; then BUILD=.device/bin; else BUILD=${OCTET_SUITE_BUILD:-.device/build}; fi
LOGS=${OCTET_SUITE_OUT:-.device/out}
FILTER=${OCTET_SUITE_FILTER:-.}
mkdir -p "$LOGS"
start=$(date +%s)

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'

binaries_run() {
  local any
  any=$(ls "$BUILD"/tests/test_cuda_* 2>/dev/null | head -1)
  [ -n "$any" ] && "$any" --list-test-cases >/dev/null 2>&1
}

if binaries_run; then
  echo "suite: using prebuilt binaries in $BUILD"
else
  echo "suite: building for sm_90a in $BUILD"
  DOCTEST_ARGS=()
  [ -f .device/deps/doctest/doctest.h ] && DOCTEST_ARGS=(-DOCTET_DOCTEST_DIR="$PWD/.device/deps")
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DOCTET_BUILD_TESTS=ON -DOCTET_BUILD_BENCHMARKS=ON -DOCTET_BUILD_EXAMPLES=ON "${DOCTEST_ARGS[@]}" \
    >"$LOGS/configure.log" 2>&1 || { tail -30 "$LOGS/configure.log"; exit 1; }
  targets=$(cmake --build "$BUILD" --target help 2>/dev/null | grep -oE '(test_cuda_|gpubench_)[A-Za-z0-9_]+' | sort -u | grep -E "$FILTER")
  if echo training_cuda | grep -qE "$FILTER"; then targets="$targets example_08_training"; fi
  cmake --build "$BUILD" -j "$(nproc)" --target $targets >"$LOGS/build.log" 2>&1 || { grep -E "error" "$LOGS/build.log" | head -40; exit 1; }
  echo "suite: built in $(( $(date +%s) - start )) s"
fi

# Prebuilt binaries link the CUDA libraries (cuBLASLt, NCCL) by soname; where the machine keeps
# them elsewhere than here, find them once and put their folders on the loader path.
for lib in libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
  if ! ldconfig -p 2>/dev/null | grep -q "$lib"; then
    found=$(find /usr/local /usr/lib /opt -xdev -name "$lib*" 2>/dev/null | head -1)
    [ -n "$found" ] && export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done

declare -a rows
status=0
for t in "$BUILD"/tests/test_cuda_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t"); name=${name#test_cuda_}
  echo "$name" | grep -qE "$FILTER" || continue
  for suite in gpu cuda; do
    t0=$(date +%s%N)
    "$t" --test-suite=$suite >"$LOGS/test_${name}_${suite}.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    summary=$(grep -E "^\[doctest\] (test cases|assertions)" "$LOGS/test_${name}_${suite}.log" | sed 's/\[doctest\] //' | tr -s ' ' | paste -sd';' -)
    case $rc in 0) verdict=PASS ;; 77) verdict=SKIP ;; *) verdict=FAIL; status=1 ;; esac
    rows+=("test|$name [$suite]|$verdict|$ms ms|$summary")
    [ "$verdict" = FAIL ] && grep -B2 -A6 "ERROR\|FATAL" "$LOGS/test_${name}_${suite}.log" | head -60
  done
done

for b in "$BUILD"/bench/gpubench_*; do
  [ -x "$b" ] || continue
  name=$(basename "$b"); name=${name#gpubench_}
  echo "$name" | grep -qE "$FILTER" || continue
  "$b" >"$LOGS/bench_${name}.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then status=1; rows+=("bench|$name|FAIL|exit $rc|see bench_${name}.log"); tail -20 "$LOGS/bench_${name}.log"; fi
  while IFS='|' read -r _ bench metric value unit note; do
    rows+=("bench|$bench|$metric|$value $unit|$note")
  done < <(grep '^OCTET_RESULT|' "$LOGS/bench_${name}.log")
done

# The torch ops' CUDA kernels, built against the torch that is here (the Python peers below load them too).
PYBUILD=${OCTET_SUITE_PYBUILD:-.device/pybuild}
if echo torch_cuda | grep -qE "$FILTER" && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  t0=$(date +%s%N)
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  if cmake -S . -B "$PYBUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
       -DOCTET_BUILD_TESTS=OFF -DOCTET_BUILD_BENCHMARKS=OFF -DOCTET_BUILD_EXAMPLES=OFF -DOCTET_BUILD_PYTHON=ON \
       -DOCTET_TORCH_CUDA=ON -DPython3_EXECUTABLE="$(command -v python3)" >"$LOGS/py_configure.log" 2>&1 &&
     cmake --build "$PYBUILD" -j "$(nproc)" --target octet_torch_quant octet_torch_gemm octet_torch_optim octet_torch_linear octet_torch_attention octet_torch_codec >"$LOGS/py_build.log" 2>&1; then
    OCTET_REQUIRE_CUDA=1 OCTET_TORCH_FAMILIES=quant,gemm,optim,linear,attention,codec PYTHONPATH=python OCTET_LIBRARY_DIR="$PYBUILD/python/lib" \
      timeout 600 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py >"$LOGS/py_torch_cuda.log" 2>&1
    rc=$?
    summary=$(tail -1 "$LOGS/py_torch_cuda.log")
  else
    rc=1; summary="build failed: see py_configure.log / py_build.log"
    grep -E "error|Error" "$LOGS/py_configure.log" "$LOGS/py_build.log" | head -20
  fi
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  if [ $rc -eq 0 ]; then verdict=PASS; else verdict=FAIL; status=1; tail -40 "$LOGS/py_torch_cuda.log" 2>/dev/null; fi
  rows+=("test|torch_cuda [pytest, build included]|$verdict|$ms ms|$summary")
fi

# The training program with its FP8 linears on the GPU (--linears cuda), held to the same run on the host.
if echo training_cuda | grep -qE "$FILTER"; then
  exe="$BUILD/examples/example_08_training"
  if [ -x "$exe" ]; then
    t0=$(date +%s%N)
    python3 examples/08_training/cuda_matches_host.py "$exe" "$LOGS/training_cuda" -- \
      --recipes fp8_delayed,fp8_tensorwise,fp8_blockwise,mxfp8 --seeds 0 --steps 30 --sizes tiny \
      --corpus data/kjv_genesis_exodus.txt >"$LOGS/training_cuda.log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [ $rc -eq 0 ] && ! grep -q OCTET_SKIP "$LOGS/training_cuda.log"; then verdict=PASS; else verdict=FAIL; status=1; tail -20 "$LOGS/training_cuda.log"; fi
    rows+=("test|training_cuda [--linears cuda vs host]|$verdict|$ms ms|$(tail -1 "$LOGS/training_cuda.log")")
  else
    rows+=("test|training_cuda [--linears cuda vs host]|SKIP|-|$exe not built (bench/prepare_device.sh builds it)")
  fi
fi

# Peers in Python (PyTorch is on the GPU machine; other wheels travel in .whl, see bench/prepare_device.sh).
if command -v python3 >/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/octet_site .whl/*.whl \
      >"$LOGS/pip.log" 2>&1 && export PYTHONPATH=/tmp/octet_site${PYTHONPATH:+:$PYTHONPATH}
  fi
  for py in bench/gpu/*.py; do
    [ -f "$py" ] || continue
    name=$(basename "$py" .py)
    echo "$name" | grep -qE "$FILTER" || continue
    OCTET_BUILD="$BUILD" OCTET_LIBRARY_DIR="${OCTET_LIBRARY_DIR:-$PYBUILD/python/lib}" PYTHONUNBUFFERED=1 \
      timeout 300 python3 "$py" >"$LOGS/py_${name}.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && rows+=("bench|$name.py|FAIL|exit $rc|see py_${name}.log")
    while IFS='|' read -r _ bench metric value unit note; do
      rows+=("bench|$bench|$metric|$value $unit|$note")
    done < <(grep '^OCTET_RESULT|' "$LOGS/py_${name}.log")
  done
fi

echo
echo "octet device suite: $(( $(date +%s) - start )) s"
printf '| %-5s | %-44s | %-18s | %-16s | %s\n' kind name "result/metric" value note
printf '|-------|----------------------------------------------|--------------------|------------------|------\n'
for r in "${rows[@]}"; do
  IFS='|' read -r kind name a b c <<<"$r"
  printf '| %-5s | %-44s | %-18s | %-16s | %s\n' "$kind" "$name" "$a" "$b" "$c"
done | tee "$LOGS/summary.md"
# On the lent GPU machine, $OUT comes back (a few files at most): one archive of every log, and the table.
if [ -n "${OUT:-}" ] && [ -d "${OUT}" ]; then
  tar czf "$OUT/device_logs.tgz" -C "$LOGS" . && cp "$LOGS/summary.md" "$OUT/summary.md"
fi
exit $status
