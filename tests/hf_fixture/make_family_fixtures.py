#!/usr/bin/env python3
"""Makes the committed dense / Qwen2-MoE Hugging Face fixtures under tests/hf_fixture/ (run by hand,
not in CI), next to the Mixtral / Qwen3-MoE ones of make_fixture.py, reusing its tiny tokenizers.

One tiny model per family, saved by `transformers` with spread weights (log-probs far from uniform):
  llama          llama3 rope_scaling (original_max_position_embeddings 64, so all three bands occur)
  llama_tied     tie_word_embeddings, linear RoPE, config.json rewritten in the transformers 4 spelling
                 (rope_theta + rope_scaling {"type": ...}); transformers reloads it to the same log-probs
  llama_bf16     weights rounded to bf16 and saved as BF16 (expected computed in fp32 from them)
  qwen2          q/k/v biases
  qwen3          dense, per-head q/k RMSNorm, head_dim 24 != hidden_size / num_attention_heads
  qwen2_moe      routed experts + gated shared expert, mlp_only_layers [0], norm_topk_prob false
expected.json: log-probs of a short text and of 301 random tokens (300 log-probs) and a 20-token
greedy continuation, computed by transformers in fp32. Needs: pip install -r requirements.txt (own venv).
    python tests/hf_fixture/make_family_fixtures.py [--out tests/hf_fixture]
"""
import json
import os
import shutil

import torch
import transformers
from tokenizers import Tokenizer

from make_fixture import start, token_logprobs, write_json

HIDDEN = 64


def randomize(model, seed):
    """Spread the weights (transformers' std 0.02 gives near-uniform outputs that hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:  # norm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def make_model(name, vocab):
    common = dict(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=0, pad_token_id=0)
    if name in ("llama", "llama_bf16"):
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        cfg = transformers.LlamaConfig(rope_parameters=rope, tie_word_embeddings=False, **common)
        return transformers.LlamaForCausalLM(cfg)
    if name == "llama_tied":
        rope = {"rope_type": "linear", "rope_theta": 20000.0, "factor": 2.0}
        cfg = transformers.LlamaConfig(rope_parameters=rope, tie_word_embeddings=True, **common)
        return transformers.LlamaForCausalLM(cfg)
    if name == "qwen2":
        cfg = transformers.Qwen2Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       tie_word_embeddings=False, **common)
        return transformers.Qwen2ForCausalLM(cfg)
    if name == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       tie_word_embeddings=True, **common)
        return transformers.Qwen3ForCausalLM(cfg)
    if name == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4,
                                          num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[0],
                                          decoder_sparse_step=1, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
        return transformers.Qwen2MoeForCausalLM(cfg)
    raise ValueError(name)


def greedy(model, prompt, n):
    """transformers' greedy continuation and the smallest top-1/top-2 logit gap along it."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, eos_token_id=None,
                             pad_token_id=0)
        seq = out[0].tolist()
        logits = model(torch.tensor([seq])).logits[0]
    gaps = []
    for i in range(len(prompt) - 1, len(seq) - 1):
        top = torch.topk(logits[i], 2).values
        gaps.append((top[0] - top[1]).item())
    return seq[len(prompt):], min(gaps)


def to_legacy_rope_spelling(d):
    """transformers 4 wrote rope_theta at the top level and rope_scaling {"type": ...}."""
    path = os.path.join(d, "config.json")
    cfg = json.load(open(path))
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    cfg["rope_scaling"] = rope
    write_json(path, cfg)


def main():
    args, versions = start()
    plan = [("llama", "gpt2", 11), ("llama_tied", "gpt2", 12), ("llama_bf16", "gpt2", 11), ("qwen2", "qwen2", 13),
            ("qwen3", "qwen2", 14), ("qwen2_moe", "qwen2", 16)]
    for name, tkind, seed in plan:
        tok_path = os.path.join(args.out, "tokenizer_" + tkind, "tokenizer.json")
        tok = Tokenizer.from_file(tok_path)
        vocab = tok.get_vocab_size()
        model = make_model(name, vocab)
        model.eval()
        randomize(model, seed)
        if name == "llama_bf16":
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        text = "What is 12 + 35? The answer is 47."
        rand = torch.randint(0, vocab, (301,), generator=torch.Generator().manual_seed(seed)).tolist()
        cases = [{"text": text, "tokens": tok.encode(text, add_special_tokens=False).ids}, {"text": None, "tokens": rand}]
        for c in cases:
            c["logprobs"] = token_logprobs(model, c["tokens"])
        prompt_text = "The quick brown"
        prompt = tok.encode(prompt_text, add_special_tokens=False).ids
        new_tokens, gap = greedy(model, prompt, 20)
        spread = max(cases[1]["logprobs"]) - min(cases[1]["logprobs"])
        print(f"{name}: greedy min top-2 gap {gap:.3g}, random-token log-prob spread {spread:.3g}")
        assert gap > 1e-3, f"{name}: near-tie on the greedy path; change the seed"
        assert 0 not in new_tokens, f"{name}: greedy hits EOS (id 0), where `troupe generate` stops; change the seed"
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        if name == "llama_bf16":
            model.to(torch.bfloat16).save_pretrained(d)
        else:
            model.save_pretrained(d)
        gen = os.path.join(d, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        if name == "llama_tied":
            to_legacy_rope_spelling(d)
            again = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
            diff = max(abs(a - b) for a, b in zip(token_logprobs(again, rand), cases[1]["logprobs"]))
            assert diff < 1e-6, f"transformers reads the legacy rope spelling differently ({diff})"
        tok.save(os.path.join(d, "tokenizer.json"))
        greedy_case = {"prompt": prompt_text, "prompt_tokens": prompt, "new_tokens": new_tokens}
        write_json(os.path.join(d, "expected.json"),
                   {"versions": versions, "family": model.config.model_type, "cases": cases, "greedy": greedy_case})
    print("fixtures written to", args.out, versions)


if __name__ == "__main__":
    main()
