#!/usr/bin/env bash
# The sanitizer builds CI runs after the test suite (.ci/run; docs/reliability.md "Sanitizers"):
# ASan+UBSan (build-asan/) over the fast unit tests of runtime, envs, policy/io and launch, and
# TSan (build-tsan/) over runtime's unit tests. Any finding fails its test, and this script exits non-zero.
#   bash scripts/sanitizers.sh [asan|tsan|all]    (default all; env JOBS: default 2;
#   TROUPE_PYTHON: default .venv/bin/python, else /usr/bin/python3)
# The CMake presets asan and tsan (CMakePresets.json) hold the flags, the ctest selection (never
# mpirun, GPU or slow tests; none that needs a PyPI venv) and the sanitizer options; only the
# target sanitizer_tests (tests/sanitizers/CMakeLists.txt: the selection's binaries) is built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHICH=${1:-all}
case "$WHICH" in
  asan) PRESETS=(asan) ;;
  tsan) PRESETS=(tsan) ;;
  all) PRESETS=(asan tsan) ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  *) echo "sanitizers.sh: unknown argument '$WHICH' (use asan, tsan or all)" >&2; exit 2 ;;
esac
JOBS=${JOBS:-2}
# Never -Werror here: GCC's flow warnings misfire on instrumented code (-Wmaybe-uninitialized in
# libstdc++'s <regex> under ASan); the normal build (setup.sh, TROUPE_WERROR=ON in CI) checks warnings.
WERROR=OFF
PYTHON=${TROUPE_PYTHON:-/usr/bin/python3}
[ -z "${TROUPE_PYTHON:-}" ] && [ -x .venv/bin/python ] && PYTHON=$PWD/.venv/bin/python

failed=()
for p in "${PRESETS[@]}"; do
  echo "sanitizers: $p (build-$p/)"
  mkdir -p "build-$p"
  nice -n 10 cmake --preset "$p" -DTROUPE_WERROR=$WERROR -DTROUPE_PYTHON="$PYTHON" > "build-$p/configure.log" \
    || { cat "build-$p/configure.log"; exit 1; }
  nice -n 10 cmake --build --preset "$p" -j"$JOBS"
  nice -n 10 ctest --preset "$p" -j"$JOBS" || failed+=("$p")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "sanitizers: FAILED in ${failed[*]} (reports above)" >&2
  exit 1
fi
echo "sanitizers: all selected tests passed (${PRESETS[*]})"
