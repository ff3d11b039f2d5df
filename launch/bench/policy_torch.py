"""PyTorch eager baseline of `troupe bench policy`: the same model as ours, built from its config.

The model has RMSNorm, RoPE, GQA attention (with per-head q/k norm unless `qk_norm` is false), and
per layer either a top-k MoE of SwiGLU experts in the Hugging Face per-expert loop or, with
`num_experts` 0, a dense SwiGLU MLP of `intermediate_size` (the Llama layout); the LM head is tied
to the embedding with `tie_word_embeddings`. It runs as a child of the bench and answers one
command per stdin line with one JSON line on stdout, so the parent can interleave its own
repetitions with ours:
  train_step | forward | sample_kv | score_logprobs | score_logprobs_bf16 | quit
Sizes: `batch`/`seq_len` (train_step, forward) and `batch`/`prompt_len`/`new_tokens` (sample_kv);
score_logprobs: `score_batch` sequences of `score_seq_len` tokens, each token's log-prob after its
prefix under no_grad (the forward, then cross_entropy per position: what a teacher scorer answers;
score_logprobs_bf16 the same with a bf16 copy of the model);
`train_batch`, `train_seq_len`, `sample_batch` override them per case. `cases` lists the commands
to answer (default all), each run once first unless `warmup` is false.
Usage: policy_torch.py '<json config>'. It runs eager with torch.set_num_threads(threads), on the config's "device" (cpu, or cuda for the cuda_* rows).
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = json.loads(sys.argv[1])
torch.set_num_threads(int(cfg.get("threads", 2)))
torch.manual_seed(0)
DEV = torch.device(cfg.get("device", "cpu"))  # cuda: the cuda_* rows, PyTorch on the same GPU
V, C, L = cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]
NH, NKV, HD = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
E, K, H = cfg["num_experts"], cfg.get("num_experts_per_tok", 0), cfg.get("moe_intermediate_size", 0)
DENSE_H = cfg.get("intermediate_size", 0)  # the SwiGLU MLP of every layer when E == 0
QK_NORM, TIED = cfg.get("qk_norm", True), cfg.get("tie_word_embeddings", False)
EPS, THETA = cfg.get("rms_norm_eps", 1e-6), cfg.get("rope_theta", 10000.0)
B, T = cfg.get("train_batch", cfg["batch"]), cfg.get("train_seq_len", cfg["seq_len"])
SB, P, NEW = cfg.get("sample_batch", cfg["batch"]), cfg["prompt_len"], cfg["new_tokens"]


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


def rope_tables(n):
    inv = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.float32) / HD))
    f = torch.outer(torch.arange(n, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(C, NH * HD, bias=False)
        self.k_proj = nn.Linear(C, NKV * HD, bias=False)
        self.v_proj = nn.Linear(C, NKV * HD, bias=False)
        self.o_proj = nn.Linear(NH * HD, C, bias=False)
        self.q_norm, self.k_norm = (RMSNorm(HD), RMSNorm(HD)) if QK_NORM else (nn.Identity(), nn.Identity())

    def forward(self, x, cos, sin, cache=None, pos=0):
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, NH, HD)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, t, NKV, HD)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, NKV, HD).transpose(1, 2)
        c, s = cos[pos:pos + t], sin[pos:pos + t]
        q, k = q * c + rotate_half(q) * s, k * c + rotate_half(k) * s
        if cache is not None:  # KV cache: (k, v) buffers of (b, NKV, max_len, HD)
            cache[0][:, :, pos:pos + t] = k
            cache[1][:, :, pos:pos + t] = v
            k, v = cache[0][:, :, :pos + t], cache[1][:, :, :pos + t]
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(HD)
        if t > 1:
            n = k.shape[2]
            mask = torch.ones(t, n, dtype=torch.bool).triu(n - t + 1)
            att = att.masked_fill(mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, NH * HD))


class Expert(nn.Module):
    """A SwiGLU MLP of hidden size h: a routed expert (h = H) or a dense layer's MLP."""

    def __init__(self, h=H):
        super().__init__()
        self.gate_proj = nn.Linear(C, h, bias=False)
        self.up_proj = nn.Linear(C, h, bias=False)
        self.down_proj = nn.Linear(h, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Moe(nn.Module):
    """The Hugging Face Qwen3-MoE / Mixtral sparse block: loop over the experts that were hit."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(E)])

    def forward(self, x):
        b, t, c = x.shape
        x = x.view(-1, c)
        probs = self.gate(x).softmax(-1, dtype=torch.float32)
        w, sel = probs.topk(K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        mask = F.one_hot(sel, E).permute(2, 1, 0)
        for e in torch.nonzero(mask.sum((-1, -2)) > 0).flatten().tolist():
            idx, tok = torch.where(mask[e])
            out.index_add_(0, tok, self.experts[e](x[tok]) * w[tok, idx, None])
        return out.view(b, t, c)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
        self.self_attn, self.mlp = Attention(), (Moe() if E > 0 else Expert(DENSE_H))

    def forward(self, x, cos, sin, cache=None, pos=0):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([Block() for _ in range(L)])
        self.norm = RMSNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        if TIED:
            self.lm_head.weight = self.embed_tokens.weight
        self.cos, self.sin = rope_tables(max(T, P + NEW, cfg.get("score_seq_len", 0)) + 1)

    def forward(self, ids, caches=None, pos=0):
        x = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, self.cos, self.sin, caches[i] if caches else None, pos)
        return self.lm_head(self.norm(x))


model = Model().to(DEV)
model.cos, model.sin = model.cos.to(DEV), model.sin.to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator().manual_seed(1)
ids = torch.randint(0, V, (B, T), generator=gen).to(DEV)
targets = torch.roll(ids, -1, dims=1)
prompts = torch.randint(0, V, (SB, P), generator=gen).to(DEV)
SCB, SCT = cfg.get("score_batch", 0), cfg.get("score_seq_len", 0)
score_ids = torch.randint(0, V, (SCB, SCT), generator=gen).to(DEV) if SCB > 0 else None
if DEV.type != "cpu":
    gen = torch.Generator(device=DEV).manual_seed(1)


def train_step():
    opt.zero_grad(set_to_none=True)
    logits = model(ids)
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)[:, :-1]
    with torch.no_grad():
        _entropy = -(logp_all.exp() * logp_all).sum(-1)
    loss = -logp.sum() / logp.numel()
    loss.backward()
    opt.step()
    return B * T


def forward():
    with torch.no_grad():
        model(ids)
    return B * T


def sample_kv():
    with torch.no_grad():
        caches = [(torch.zeros(SB, NKV, P + NEW, HD, device=DEV), torch.zeros(SB, NKV, P + NEW, HD, device=DEV))
                  for _ in range(L)]
        logits = model(prompts, caches, 0)[:, -1]
        out, lps = [], []
        for i in range(NEW):
            logp = logits.log_softmax(-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen)
            out.append(tok)
            lps.append(logp.gather(-1, tok))
            if i + 1 < NEW:
                logits = model(tok, caches, P + i)[:, -1]
    return SB * NEW


def score_logprobs(m=None):
    with torch.no_grad():
        logits = (m or model)(score_ids[:, :-1])
        logp = -F.cross_entropy(logits.reshape(-1, V), score_ids[:, 1:].reshape(-1), reduction="none")
        del logp
    return SCB * (SCT - 1)


bf16_model = []  # score_logprobs_bf16's copy of the model in bf16, made at its first call


def score_logprobs_bf16():
    """score_logprobs with the model in bf16 (oneDNN's bf16 GEMMs; the logits' cross_entropy in bf16 too)."""
    if not bf16_model:
        import copy
        m = copy.deepcopy(model).to(torch.bfloat16)
        m.cos, m.sin = m.cos.to(torch.bfloat16), m.sin.to(torch.bfloat16)
        bf16_model.append(m)
    return score_logprobs(bf16_model[0])


CASES = {"train_step": train_step, "forward": forward, "sample_kv": sample_kv, "score_logprobs": score_logprobs,
         "score_logprobs_bf16": score_logprobs_bf16}
CASES = {name: CASES[name] for name in cfg.get("cases", list(CASES))}
for fn in CASES.values() if cfg.get("warmup", True) else []:  # warm-up
    fn()
print(json.dumps({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "quit" or not cmd:
        break
    if cmd not in CASES:
        print(json.dumps({"error": f"unknown command {cmd!r}"}), flush=True)
        continue
    t0 = time.perf_counter()
    n = CASES[cmd]()
    if DEV.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"case": cmd, "seconds": dt, "tokens": n}), flush=True)
