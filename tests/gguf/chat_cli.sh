#!/usr/bin/env bash
# policy.gguf_smollm2_chat_cli: `troupe generate FILE.gguf --messages` on the real SmolLM2-135M-Instruct
# GGUF (fetched on first use): the model's own chat template from the GGUF, greedy, and the reply
# transformers gives (smollm2_reference.json's greedy replies include this prompt's answer).
# Usage: chat_cli.sh TROUPE PYTHON SRC_DIR WORK_DIR
set -euo pipefail
TROUPE=$1 PY=$2 SRC=$3 W=$4
mkdir -p "$W"
GGUF="$(bash "$SRC/tests/gguf/fetch_smollm2.sh" "$PY")"
echo '[{"role": "user", "content": "What is 2+3?"}]' > "$W/messages.json"
"$TROUPE" generate "$GGUF" --messages "$W/messages.json" --temperature 0 --max-tokens 20 --json > "$W/out.txt"
tail -1 "$W/out.txt" | "$PY" -c "
import json, sys
r = json.loads(sys.stdin.read())
print(repr(r['text']))
assert r['text'].startswith('2 + 3 = 5'), r['text']
assert r['prompt_tokens'][:2] == [1, 9690], r['prompt_tokens'][:2]  # <|im_start|>system: the template's own, no BOS added
"
