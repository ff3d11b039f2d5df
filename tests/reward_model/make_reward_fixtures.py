#!/usr/bin/env python3
"""Makes the committed reward-model fixtures under tests/reward_model/ (run by hand, not in CI): tiny
random transformers sequence-classification checkpoints and transformers' scores of chat
conversations on them, which policy.reward_model_golden compares troupe's scores with.
  llama/  LlamaForSequenceClassification, num_labels 1 (a reward model), pad_token_id 0 (= <|endoftext|>),
          SmolLM2's chat template
  qwen3/  Qwen3ForSequenceClassification, num_labels 2, pad_token_id null, Qwen3's chat template
Each dir: config.json, model.safetensors (with score.weight), tokenizer.json, tokenizer_config.json,
chat_template.jinja (what save_pretrained writes), expected.json {cases: [{messages, text, tokens,
scores}], raw: [{tokens, scores}] (token lists scored as given: trailing pads, a pad inside), versions}.
The tokenizer is tests/hf_fixture/'s tiny byte-level BPE (its <|im_start|>, <|im_end|> are special).
Needs the venv of tests/peft/ensure_peft.py (transformers, torch from PyPI):
    $(python3 tests/peft/ensure_peft.py | tail -1) tests/reward_model/make_reward_fixtures.py
"""
import json
import os
import shutil

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TEMPLATES = os.path.join(ROOT, "tests", "chat_template", "templates")

CONVERSATIONS = [
    ("What is 3 + 4?", "7"),
    ("Name a colour.", "Blue, like the sky."),
    ("Say hello twice.", "hello hello"),
    ("Is the answer 42?", "I think so, yes.<|endoftext|>"),  # the pad/eos text inside the response
]


def randomize(model, seed):
    """Spread the weights (std 0.02 gives near-constant scores that hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def make_model(name, vocab):
    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=1, eos_token_id=2)
    if name == "llama":
        cfg = transformers.LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                       num_labels=1, pad_token_id=0, **common)
        return transformers.LlamaForSequenceClassification(cfg), "HuggingFaceTB-SmolLM2-135M-Instruct.jinja"
    if name == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                                       num_labels=2, pad_token_id=None, **common)
        return transformers.Qwen3ForSequenceClassification(cfg), "Qwen-Qwen3-0.6B.jinja"
    raise ValueError(name)


def scores_of(model, seqs):
    """transformers' scores (num_labels each), every sequence alone (batch size 1)."""
    out = []
    with torch.no_grad():
        for s in seqs:
            out.append([float(f"{x:.9g}") for x in model(torch.tensor([s])).logits[0].tolist()])
    return out


def right_padded_scores(model, seqs, pad):
    """The same sequences right-padded into one batch: transformers takes the last non-pad token."""
    n = max(len(s) for s in seqs)
    with torch.no_grad():
        return model(torch.tensor([s + [pad] * (n - len(s)) for s in seqs])).logits.tolist()


def make(name, seed):
    src_tok = os.path.join(ROOT, "tests", "hf_fixture", "llama", "tokenizer.json")
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=src_tok, bos_token="<|im_start|>",
                                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    model, template = make_model(name, tok.backend_tokenizer.get_vocab_size())
    with open(os.path.join(TEMPLATES, template)) as f:
        tok.chat_template = f.read()
    randomize(model, seed)
    model.eval()
    out = os.path.join(HERE, name)
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32)
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    cases = []
    for prompt, response in CONVERSATIONS:
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tok.apply_chat_template(messages, tokenize=False)
        tokens = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"messages": messages, "text": text, "tokens": tokens})
    for c, s in zip(cases, scores_of(model, [c["tokens"] for c in cases])):
        c["scores"] = s
    raw_seqs = [[5, 17, 42, 99], [5, 17, 42, 99, 0, 0], [5, 0, 42, 99], [0, 0]]
    raw = [{"tokens": t, "scores": s} for t, s in zip(raw_seqs, scores_of(model, raw_seqs))]
    if model.config.pad_token_id is not None:  # a right-padded batch agrees with the single calls
        pad = model.config.pad_token_id
        batch = right_padded_scores(model, [c["tokens"] for c in cases], pad)
        for c, b in zip(cases, batch):
            assert all(abs(x - y) < 1e-5 for x, y in zip(c["scores"], b)), (name, c["scores"], b)
    expected = {"architecture": model.config.architectures[0], "num_labels": model.config.num_labels,
                "pad_token_id": model.config.pad_token_id, "cases": cases, "raw": raw,
                "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(name, [c["scores"] for c in cases])


if __name__ == "__main__":
    make("llama", 21)
    make("qwen3", 22)
