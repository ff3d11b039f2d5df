#!/usr/bin/env bash
# Runs every GPU test and the GPU benchmark rows in one go and prints one summary table. Builds
# only kernels/ and its GPU tests (kernels/ configured on its own: CUDA, CMake and a C++ compiler
# are all it needs; no ZeroMQ, MPI, BLAS or gtest), for sm_90 unless CUDA_ARCH says otherwise,
# with -j16 unless JOBS does. Warnings are not errors here (WERROR=ON makes them so): another CUDA
# or GCC version may warn where the project's CI does not, and this run is about the GPU.
# Usage: tests/gpu/run_all.sh [build-dir]   (default build-gpu)
# Exit status: 0 when no test failed (skipped tests are listed as such), 1 otherwise. Only "no
# device" skips (cudaErrorNoDevice, or no /dev/nvidia* at all); any other CUDA start-up error (a
# driver older than the toolkit, ...) fails every test naming it, and so this script.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-gpu}"
arch="${CUDA_ARCH:-90}"
jobs="${JOBS:-16}"
werror="${WERROR:-OFF}"
t0=$(date +%s)
log="$build/run_all.log"
mkdir -p "$build"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
else
  echo "gpu: nvidia-smi not available"
fi
if ! compgen -G "/dev/nvidia[0-9]*" >/dev/null; then
  echo "gpu: no /dev/nvidia* device nodes: the gpu tests will be skipped (no device)"
fi
echo "configure + build (sm_$arch, -j$jobs) ..."
if ! cmake -S "$root/kernels" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DTROUPE_WERROR="$werror" >"$log" 2>&1; then
  tail -40 "$log"; echo "configure FAILED (log: $log)"; exit 1
fi
if ! cmake --build "$build" -j"$jobs" >>"$log" 2>&1; then
  grep -E "error|Error" "$log" | head -40; echo "build FAILED (log: $log)"; exit 1
fi
grep -i "spill" "$log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort -u | head -20 | sed 's/^/ptxas: /'
tb=$(date +%s)
echo "built in $((tb - t0)) s; running the gpu tests ..."
ctest --test-dir "$build" -L gpu -V --timeout 300 >"$build/ctest.log" 2>&1
ctest_rc=$?
echo
printf '%-28s %-8s %8s\n' "test" "result" "seconds"
printf '%-28s %-8s %8s\n' "----" "------" "-------"
grep -E "^ *[0-9]+/[0-9]+ Test +#[0-9]+: " "$build/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //' |
  awk '{name=$1; res="?"; secs="";
        for (i=2;i<=NF;i++) { if ($i ~ /Passed$/) res="passed"; if ($i ~ /Skipped/) res="SKIPPED";
                              if ($i ~ /Failed|Exception|Timeout|Not Run/) res="FAILED"; if ($i=="sec") secs=$(i-1) }
        printf "%-28s %-8s %8s\n", name, res, secs }'
grep -E '^[0-9]+: FAIL' "$build/ctest.log" | head -40
echo
echo "benchmark rows (suite kernels, cuda_*):"
grep -h '"case":"cuda_' "$build/ctest.log" | sed -E 's/^[0-9]+: //' || true
"$build/tests_gpu/troupe_gpu_bench" 2>&1 | grep -E '^\{|cuda' || true
echo
echo "total $(( $(date +%s) - t0 )) s; ctest log: $build/ctest.log"
[ "$ctest_rc" -eq 0 ] && exit 0 || exit 1
