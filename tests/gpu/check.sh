#!/usr/bin/env bash
# The GPU check in two halves, for a GPU machine that has the CUDA toolkit and driver but no
# ZeroMQ, MPI, yaml-cpp, BLAS or network. Invariant: the run half skips (77) only when the machine
# has no GPU at all; a GPU that is present but unusable, a missing library or any failed part fails.
#
#   tests/gpu/check.sh --prepare [DIR]   here (a build machine): configures a build for sm_90 only
#       (CUDA_ARCH overrides; BUILD names the build folder, default build-gpu-check; an existing
#       build is reconfigured to that one architecture, and a binary with device code for another
#       fails the prepare), builds troupe, the GPU test binaries, gpu.model_on_cuda,
#       kernels.cuda_smoke and troupe_gpu_bench, and copies them, stripped, with the shared
#       libraries they load that are not the C/C++ runtime or CUDA's own (ldd), and the quickstart
#       config into DIR (default build-gpu-check/bundle): one folder, at most 64 MiB (checked).
#   tests/gpu/check.sh DIR               there: runs every part below against DIR and writes one
#       report (DIR/report.txt, or REPORT), within 6 minutes:
#         1. libraries: every binary's libraries resolve (else fail, naming them);
#         2. the GPU: no /dev/nvidia* and no device -> "no GPU", exit 77; device nodes present but
#            kernels.cuda_smoke cannot use the GPU -> fail;
#         3. the gpu.* tests (each exits 77 only where the device is missing, e.g. nccl with 1 GPU);
#         4. compute-sanitizer memcheck, racecheck and synccheck on four of them (2 minutes in all);
#         5. gpu.model_on_cuda;
#         6. 10 quickstart steps (5 SFT + 5 GRPO) on cpu, on cuda with fp32 GEMMs (no TF32) and on
#            cuda with the defaults (bf16); SFT loss and grad_norm of cuda fp32 within 1e-3
#            relative of cpu's, GRPO reward_mean within 0.15, bf16's SFT loss within 3e-2 relative,
#            every metric finite;
#         7. every cuda_* benchmark row (troupe_gpu_bench, troupe bench kernels / policy).
# Exit status (run): 0 every part passed, 1 a part failed, 77 no GPU (skipped). --prepare: 0 or 1.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
max_bundle=$((64 * 1024 * 1024))
gpu_tests="gpu_ops_vs_cpu_test gpu_moe_round_trip_test gpu_train_step_test gpu_reload_double_buffer_test
gpu_checked_calls_test gpu_flash_attention_test gpu_nccl_all_reduce_test gpu_optimizer_graphs_test
gpu_moe_ep_test gpu_sparse_buffer_test"
sanitized="gpu_checked_calls_test gpu_reload_double_buffer_test gpu_flash_attention_test gpu_moe_round_trip_test"

# ---- prepare --------------------------------------------------------------------------------------
# A library the GPU machine has itself: the C and C++ runtime, and the CUDA driver and toolkit's.
system_lib() {
  case "$(basename "$1")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libutil.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*|linux-vdso*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*|libnvidia*|libnvrtc*) return 0 ;;
  esac
  return 1
}

prepare() {
  local out="${1:-$root/build-gpu-check/bundle}"
  local build="${BUILD:-$root/build-gpu-check}" arch="${CUDA_ARCH:-90}" jobs="${JOBS:-2}"
  local targets="troupe policy_model_on_cuda_test kernels_cuda_smoke_test troupe_gpu_bench $gpu_tests"
  # Always (re)configured for sm_$arch alone: the check runs on H100/H200, and a second
  # architecture's device code would not fit the bundle (an existing build is switched to it).
  echo "prepare: build $build (sm_$arch only), bundle $out"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DTROUPE_WERROR=OFF >"$build/check_configure.log" 2>&1 || { tail -30 "$build/check_configure.log"; echo "prepare: configure FAILED"; return 1; }
  # shellcheck disable=SC2086
  cmake --build "$build" -j"$jobs" --target $targets >"$build/check_build.log" 2>&1 ||
    { grep -E "error|Error" "$build/check_build.log" | head -30; echo "prepare: build FAILED (log: $build/check_build.log)"; return 1; }
  rm -rf "$out"
  mkdir -p "$out/bin" "$out/lib" "$out/configs"
  local t f
  for t in $targets; do
    f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
    [ -n "$f" ] || { echo "prepare: built no binary $t"; return 1; }
    cp "$f" "$out/bin/$t" && strip --strip-unneeded "$out/bin/$t"
  done
  # The shared libraries the binaries load that the GPU machine lacks (everything but system_lib).
  local lib
  for lib in $(ldd "$out"/bin/* 2>/dev/null | awk '/=> \// {print $3}' | sort -u); do
    system_lib "$lib" && continue
    cp -L "$lib" "$out/lib/$(basename "$lib")" && strip --strip-unneeded "$out/lib/$(basename "$lib")" 2>/dev/null
  done
  if ldd "$out"/bin/* 2>/dev/null | grep -q "not found"; then
    ldd "$out"/bin/* | grep "not found" | sort -u; echo "prepare: a library does not resolve here"; return 1
  fi
  # Device code for sm_$arch only (cuobjdump lists each binary's cubins and PTX).
  local cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}" other
  if [ -x "$cuobjdump" ]; then
    other=$(for f in "$out"/bin/*; do "$cuobjdump" --list-elf --list-ptx "$f" 2>/dev/null; done |
      grep -oE "sm_[0-9]+a?" | sort -u | grep -vx "sm_$arch" | tr '\n' ' ')
    [ -z "$other" ] || { echo "prepare: FAILED: device code for $other besides sm_$arch"; return 1; }
  fi
  # Libraries over 1 MiB travel gzipped (OpenBLAS alone is ~35 MiB); the run half unpacks them.
  find "$out/lib" -type f -size +1M -exec gzip -9 {} \;
  cp "$root/configs/quickstart.yaml" "$out/configs/"
  cp "$0" "$out/check.sh"
  git -C "$root" rev-parse HEAD >"$out/commit" 2>/dev/null || true
  local size
  size=$(du -sb "$out" | cut -f1)
  echo "prepare: $(ls "$out/bin" | wc -l) binaries, libraries: $(ls "$out/lib" | tr '\n' ' ')"
  echo "prepare: $out holds $size bytes ($((size / 1048576)) MiB; the limit is 64 MiB)"
  [ "$size" -le "$max_bundle" ] || { echo "prepare: FAILED: the bundle is over 64 MiB"; return 1; }
  echo "prepare: done; on the GPU machine run: $out/check.sh $out"
}

# ---- run ------------------------------------------------------------------------------------------
failed=0
last_rc=0
row() { printf '%-44s %-8s %s\n' "$1" "$2" "${3:-}"; [ "$2" = FAILED ] && failed=1; return 0; }

# Runs "$@" with a time limit; prints PASSED, SKIPPED (77) or FAILED with the seconds taken.
run_row() {
  local name="$1" limit="$2"; shift 2
  local t0 rc
  t0=$(date +%s.%N)
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  last_rc=$rc
  local s
  s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f s", b-a}')
  case $rc in
    0) row "$name" PASSED "$s" ;;
    77) row "$name" SKIPPED "$s: $(tail -1 "$logs/$name.log")" ;;
    124) row "$name" FAILED "$s: over its ${limit} s limit" ;;
    *) row "$name" FAILED "$s: exit $rc: $(grep -m3 -E 'FAIL|rror' "$logs/$name.log" | tr '\n' ' ' | cut -c1-300)" ;;
  esac
}

# metric KEY of each row of phase PHASE in FILE, one per line
metric() { grep "\"phase\":\"$2\"" "$3" | grep -o "\"$1\":[-0-9.eE+a-z]*" | cut -d: -f2; }

# Every value of KEY in phase PHASE of run B within TOL (relative when REL=1) of run A's.
compare() {
  local key="$1" phase="$2" a="$3" b="$4" tol="$5" rel="$6"
  paste <(metric "$key" "$phase" "$a") <(metric "$key" "$phase" "$b") |
    awk -v tol="$tol" -v rel="$rel" -v k="$key" '
      { n++; if ($1 == "" || $2 == "" || $1 != $1 + 0 || $2 != $2 + 0) { bad = bad " row " n ": not a number"; next }
        d = $1 - $2; if (d < 0) d = -d; lim = rel ? tol * ($1 < 0 ? -$1 : $1) + 1e-7 : tol
        if (d > lim) bad = bad sprintf(" row %d: %g vs %g", n, $1, $2) }
      END { if (n == 0) { print k ": no rows"; exit 1 } if (bad != "") { print k ":" bad; exit 1 } }'
}

quickstart() {
  local troupe="$dir/bin/troupe" steps="--set sft.max_steps=5 --set grpo.max_steps=5"
  local q="$logs/quickstart" name dev
  mkdir -p "$q"
  for name in cpu cuda_fp32 cuda_bf16; do
    local extra=""
    case $name in
      cpu) dev=cpu ;;
      cuda_fp32) dev=cuda; extra="--set policy.compute_dtype=fp32 --set policy.allow_tf32=false" ;;
      cuda_bf16) dev=cuda ;;
    esac
    # shellcheck disable=SC2086
    run_row "quickstart.$name" 120 "$troupe" run "$dir/configs/quickstart.yaml" --set run.dir="$q/$name" \
      --set policy.device=$dev $steps $extra
  done
  local c="$q/cpu/metrics.jsonl" f="$q/cuda_fp32/metrics.jsonl" b="$q/cuda_bf16/metrics.jsonl" why=""
  for m in "$c" "$f" "$b"; do [ -s "$m" ] || why="$why no $m;"; done
  if [ -z "$why" ]; then
    why+=$(compare loss sft "$c" "$f" 1e-3 1)
    why+=$(compare grad_norm sft "$c" "$f" 1e-3 1)
    why+=$(compare reward_mean grpo "$c" "$f" 0.15 0)
    why+=$(compare loss sft "$c" "$b" 3e-2 1)
    why+=$(compare reward_mean grpo "$c" "$b" 1e9 0)  # bf16: only finite
    grep -qiE '"[a-z_/]+":(nan|-?inf)' "$f" "$b" && why+=" a non-finite metric;"
  fi
  [ -z "$why" ] && row "quickstart.cuda_vs_cpu" PASSED "fp32: SFT loss, grad_norm 1e-3 rel; reward_mean 0.15; bf16: loss 3e-2 rel" ||
    row "quickstart.cuda_vs_cpu" FAILED "$why"
}

sanitizers() {
  local san t tool start left
  san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  [ -n "$san" ] || { row "sanitizers" FAILED "compute-sanitizer not found (CUDA toolkit bin/)"; return; }
  start=$(date +%s)
  for tool in memcheck racecheck synccheck; do
    for t in $sanitized; do
      left=$((120 - ($(date +%s) - start)))
      [ "$left" -ge 5 ] || { row "sanitizer.$tool.$t" FAILED "the 2-minute sanitizer budget ran out"; continue; }
      run_row "sanitizer.$tool.${t%_test}" $((left < 40 ? left : 40)) "$san" --tool "$tool" --error-exitcode 1 "$dir/bin/$t"
    done
  done
}

benches() {
  run_row bench.troupe_gpu_bench 60 "$dir/bin/troupe_gpu_bench"
  run_row bench.kernels 90 "$dir/bin/troupe" bench kernels --quick --filter cuda_
  run_row bench.policy 90 "$dir/bin/troupe" bench policy --quick --filter cuda_
  echo "cuda_* benchmark rows:"
  grep -h '"case":"cuda_' "$logs"/bench.*.log | sed 's/^/  /'
  grep -qh '"case":"cuda_' "$logs"/bench.*.log || row "bench.rows" FAILED "no cuda_* row was printed"
}

run_check() {
  dir="$(cd "$1" && pwd)" || { echo "check: no folder $1"; exit 1; }
  local report="${REPORT:-$dir/report.txt}" t0
  logs="$dir/logs"
  rm -rf "$logs"; mkdir -p "$logs"
  local gz
  for gz in "$dir"/lib/*.gz; do [ -e "$gz" ] && [ ! -e "${gz%.gz}" ] && gunzip -kf "$gz"; done
  export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OMP_WAIT_POLICY=PASSIVE
  t0=$(date +%s)
  {
    echo "troupe GPU check of $(cat "$dir/commit" 2>/dev/null || echo '?'), $(date -u)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    local missing
    missing=$(ldd "$dir"/bin/* 2>/dev/null | grep "not found" | sort -u | tr -s ' \t' ' ')
    [ -z "$missing" ] || row "libraries" FAILED "unresolved:$missing"
    # 2. the GPU: only "no device at all" skips
    run_row kernels.cuda_smoke 60 "$dir/bin/kernels_cuda_smoke_test"
    # (TROUPE_CHECK_NODES replaces the device-node pattern: for the script's own test)
    local nodes="${TROUPE_CHECK_NODES:-/dev/nvidia[0-9]*}"
    if [ "$last_rc" -eq 77 ]; then
      if ! compgen -G "$nodes" >/dev/null; then
        echo "no GPU: no /dev/nvidia* device nodes and CUDA sees no device; nothing else ran (skipped, exit 77)"
        exit 77
      fi
      row "gpu" FAILED "$nodes exists but CUDA sees no device (CUDA_VISIBLE_DEVICES? a driver problem?)"
    fi
    if [ "$last_rc" -ne 0 ]; then
      echo "the GPU is present but unusable (kernels.cuda_smoke: $logs/kernels.cuda_smoke.log); nothing else ran"
      tail -5 "$logs/kernels.cuda_smoke.log" | sed 's/^/  /'
      echo "RESULT: FAILED"
      exit 1
    fi
    for t in $gpu_tests; do run_row "${t%_test}" 90 "$dir/bin/$t"; done
    sanitizers
    run_row gpu.model_on_cuda 120 "$dir/bin/policy_model_on_cuda_test"
    quickstart
    benches
    echo "total $(( $(date +%s) - t0 )) s (budget 360 s)"
    [ $(( $(date +%s) - t0 )) -le 360 ] || row "time" FAILED "the check took over 6 minutes"
    [ "$failed" -eq 0 ] && echo "RESULT: passed" || echo "RESULT: FAILED"
    exit "$failed"
  } 2>&1 | tee "$report"
  local rc=${PIPESTATUS[0]}
  echo "report: $report"
  exit "$rc"
}

case "${1:-}" in
  --prepare) shift; prepare "$@"; exit $? ;;
  ""|-h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  *) run_check "$1" ;;
esac
