#!/usr/bin/env python3
"""The llama_cpp baseline of `troupe bench policy`'s qlora_decode_smollm2_b1 row: llama-cpp-python
(ensure_llama_cpp.py's venv) on the same GGUF, 2 threads, greedy; milliseconds per generated token
net of the model load and the prompt's prefill (the time of N + 1 tokens minus that of 1, over N).
    llama_cpp_decode.py GGUF PROMPT_IDS(comma-separated) N  -> one JSON line {"ms_per_token": x, ...}"""
import json
import sys
import time

import llama_cpp


def decode_seconds(llm, prompt, n):
    """Seconds from the start of the prefill to the n-th greedy token (prefill included)."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    for _ in range(n):
        tok = llm.sample(top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0)
        llm.eval([tok])
    return time.perf_counter() - t0


def main():
    path, ids, n = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
    llm = llama_cpp.Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=256, n_batch=64, verbose=False,
                          seed=0)
    decode_seconds(llm, ids, 4)  # warm-up: pages, the threadpool
    one = decode_seconds(llm, ids, 1)
    full = decode_seconds(llm, ids, n + 1)
    print(json.dumps({"ms_per_token": 1e3 * (full - one) / n, "version": llama_cpp.__version__}), flush=True)


if __name__ == "__main__":
    main()
