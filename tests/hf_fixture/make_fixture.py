#!/usr/bin/env python3
"""Makes the committed Hugging Face fixtures under tests/hf_fixture/ (run by hand, not in CI).

Two tiny byte-level BPE tokenizers made with `tokenizers` (GPT-2 style ByteLevel regex, and the
Qwen2/GPT-4 style Split regex + NFC), their expected encodings, and one tiny model per family
(Mixtral, Qwen3-MoE) saved by `transformers` twice: the default per-expert layout and the fused
one (save_original_format=False). expected.json holds per-token log-probs and a greedy
continuation computed by transformers in fp32. Needs: pip install -r requirements.txt (own venv).
    python tests/hf_fixture/make_fixture.py [--out tests/hf_fixture]
"""
import argparse
import json
import os
import shutil

import torch
import tokenizers
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine; we've done it before and you'd agree.",
    "What is 12 + 35? The answer is 47. Then 100 - 58 = 42.",
    "Reinforcement learning from verifiable rewards trains the policy to solve tasks.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Café, naïve, résumé — déjà vu. 中文 文本 测试. Emoji: 🙂🚀",
    "Sort the numbers 9 3 7 1 in ascending order: 1 3 7 9.",
    "Count the letters in 'banana': b a n a n a has six letters.",
] * 20

CASES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm DON'T you'll We'VE",
    "What is 12345 + 678?",
    "  leading spaces and   inner   runs  \n\n\tTabs\tand\nnewlines\r\n",
    "Café naïve 中文文本 🙂🚀 ü",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "def f(x):\n    return x*x  # square",
    "",
    "a",
    "!!!???...,,,",
]


def train_tokenizer(kind):
    tok = Tokenizer(models.BPE())
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=360, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def randomize(model, seed):
    """transformers' init (std 0.02) gives near-uniform outputs; spread the weights so log-probs and routing
    are decisive and a wrong mapping shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))


def make_model(family, vocab):
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, num_experts_per_tok=2, max_position_embeddings=128,
                  rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=0, pad_token_id=0)
    if family == "mixtral":
        cfg = transformers.MixtralConfig(intermediate_size=16, num_local_experts=4, rope_theta=10000.0,
                                         tie_word_embeddings=False, **common)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen3MoeConfig(intermediate_size=24, moe_intermediate_size=16, num_experts=4,
                                          mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=True,
                                          rope_theta=50000.0, tie_word_embeddings=True, **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    model.eval()
    return model


def token_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def start():
    """Command line (--out) and the seeded, 2-thread torch both fixture scripts use; returns (args, versions)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    return args, {"transformers": transformers.__version__, "torch": torch.__version__, "tokenizers": tokenizers.__version__}


def main():
    args, versions = start()

    # Tokenizers and their expected encodings.
    toks = {}
    for kind in ("gpt2", "qwen2"):
        tok = train_tokenizer(kind)
        d = os.path.join(args.out, "tokenizer_" + kind)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        cases = []
        for text in CASES:
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        write_json(os.path.join(d, "expected.json"), {"versions": versions, "cases": cases})
        toks[kind] = tok

    # Models: per-expert (default save) and fused layouts of the same weights.
    for family, tkind, seed in (("mixtral", "gpt2", 1), ("qwen3_moe", "qwen2", 2)):
        tok = toks[tkind]
        model = make_model(family, tok.get_vocab_size())
        randomize(model, seed)
        text = "What is 12 + 35? The answer is 47."
        cases = [
            {"text": text, "tokens": tok.encode(text, add_special_tokens=False).ids},
            {"text": None, "tokens": torch.randint(0, tok.get_vocab_size(), (24,), generator=torch.Generator().manual_seed(seed)).tolist()},
        ]
        for c in cases:
            c["logprobs"] = token_logprobs(model, c["tokens"])
        prompt = tok.encode("The quick brown", add_special_tokens=False).ids
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8, eos_token_id=None,
                                 pad_token_id=0)
        greedy = {"prompt": "The quick brown", "prompt_tokens": prompt, "new_tokens": out[0, len(prompt):].tolist()}
        expected = {"versions": versions, "family": family, "cases": cases, "greedy": greedy}
        for layout in ("per_expert", "fused"):
            d = os.path.join(args.out, family if layout == "per_expert" else family + "_fused")
            shutil.rmtree(d, ignore_errors=True)
            model.save_pretrained(d, save_original_format=(layout == "per_expert"))
            for extra in ("generation_config.json",):
                if os.path.exists(os.path.join(d, extra)):
                    os.remove(os.path.join(d, extra))
            tok.save(os.path.join(d, "tokenizer.json"))
            write_json(os.path.join(d, "expected.json"), dict(expected, layout=layout))
    print("fixtures written to", args.out, versions)


if __name__ == "__main__":
    main()
