#!/usr/bin/env python3
"""PyTorch reference for policy.golden: builds the same tiny models as troupe's policy (Qwen3-MoE
with q/k norm, GQA, a dense first layer, untied head; Mixtral with GQA, a shared expert, tied
head), runs them on one packed batch of sequences of different lengths, and writes inputs,
weights, logits, per-token log-probs and entropies, the loss, every gradient and the losses of
several AdamW steps to a JSON fixture per config. Written from the model definitions (HF layout
and math), not from transformers code. Usage: make_golden.py OUT_DIR
"""
import json
import math
import os
import sys

import torch

torch.set_num_threads(2)
torch.manual_seed(0)

CONFIGS = {
    "qwen3_moe": dict(family="qwen3_moe", vocab_size=50, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
                      shared_expert_intermediate_size=0, mlp_only_layers=[0], rope_theta=10000.0,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, router_aux_loss_coef=0.01),
    "mixtral": dict(family="mixtral", vocab_size=40, hidden_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=6, intermediate_size=32,
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=20, norm_topk_prob=True,
                    shared_expert_intermediate_size=12, mlp_only_layers=[], rope_theta=1000000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, router_aux_loss_coef=0.02),
}
SEQ_LENS = [7, 3, 12, 1, 5]
TEMPERATURE = 0.8
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, steps=3)


def param_shapes(c):
    C, NH, NKV, HD, V = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["vocab_size"]
    mix = c["family"] == "mixtral"
    shapes = {"model.embed_tokens.weight": (V, C)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes[p + "input_layernorm.weight"] = (C,)
        shapes[p + "self_attn.q_proj.weight"] = (NH * HD, C)
        shapes[p + "self_attn.k_proj.weight"] = (NKV * HD, C)
        shapes[p + "self_attn.v_proj.weight"] = (NKV * HD, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, NH * HD)
        if not mix:
            shapes[p + "self_attn.q_norm.weight"] = (HD,)
            shapes[p + "self_attn.k_norm.weight"] = (HD,)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        if l in c["mlp_only_layers"]:
            I = c["intermediate_size"]
            shapes[p + "mlp.gate_proj.weight"] = (I, C)
            shapes[p + "mlp.up_proj.weight"] = (I, C)
            shapes[p + "mlp.down_proj.weight"] = (C, I)
            continue
        m = p + ("block_sparse_moe." if mix else "mlp.")
        E, H = c["num_experts"], c["moe_intermediate_size"]
        shapes[m + "gate.weight"] = (E, C)
        for e in range(E):
            x = m + f"experts.{e}."
            shapes[x + ("w1.weight" if mix else "gate_proj.weight")] = (H, C)
            shapes[x + ("w3.weight" if mix else "up_proj.weight")] = (H, C)
            shapes[x + ("w2.weight" if mix else "down_proj.weight")] = (C, H)
        HS = c["shared_expert_intermediate_size"]
        if HS > 0:
            shapes[m + "shared_expert.gate_proj.weight"] = (HS, C)
            shapes[m + "shared_expert.up_proj.weight"] = (HS, C)
            shapes[m + "shared_expert.down_proj.weight"] = (C, HS)
    shapes["model.norm.weight"] = (C,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, C)
    return shapes


def rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(positions, hd, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rope(x, cos, sin):  # x (T, heads, hd); HF rotate_half
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def swiglu(x, wg, wu, wd):
    return torch.nn.functional.silu(x @ wg.T) * (x @ wu.T) @ wd.T


def forward(c, W, tokens, cu, positions):
    C, NH, NKV, HD = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    mix, eps = c["family"] == "mixtral", c["rms_norm_eps"]
    T = tokens.shape[0]
    cos, sin = rope_tables(positions, HD, c["rope_theta"])
    x = W["model.embed_tokens.weight"][tokens]
    aux_total = torch.zeros(())
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
        q = (h @ W[p + "self_attn.q_proj.weight"].T).view(T, NH, HD)
        k = (h @ W[p + "self_attn.k_proj.weight"].T).view(T, NKV, HD)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(T, NKV, HD)
        if not mix:
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        outs = []
        for s in range(len(cu) - 1):
            a, b = cu[s], cu[s + 1]
            qs, ks, vs = q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)
            sc = qs @ ks.transpose(1, 2) / math.sqrt(HD)
            mask = torch.ones(b - a, b - a, dtype=torch.bool).tril()
            sc = sc.masked_fill(~mask, float("-inf"))
            outs.append((sc.softmax(-1) @ vs).transpose(0, 1))
        att = torch.cat(outs, dim=0).reshape(T, NH * HD)
        x = x + att @ W[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
        if l in c["mlp_only_layers"]:
            y = swiglu(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
        else:
            m = p + ("block_sparse_moe." if mix else "mlp.")
            E, K = c["num_experts"], c["num_experts_per_tok"]
            probs = (h @ W[m + "gate.weight"].T).softmax(-1)
            topw, topi = probs.topk(K, dim=-1)
            if mix or c["norm_topk_prob"]:
                topw = topw / topw.sum(-1, keepdim=True)
            y = torch.zeros_like(h)
            for e in range(E):
                x_ = m + f"experts.{e}."
                wg = W[x_ + ("w1.weight" if mix else "gate_proj.weight")]
                wu = W[x_ + ("w3.weight" if mix else "up_proj.weight")]
                wd = W[x_ + ("w2.weight" if mix else "down_proj.weight")]
                tok, slot = (topi == e).nonzero(as_tuple=True)
                if tok.numel():
                    y = y.index_add(0, tok, topw[tok, slot][:, None] * swiglu(h[tok], wg, wu, wd))
            if c["shared_expert_intermediate_size"] > 0:
                y = y + swiglu(h, W[m + "shared_expert.gate_proj.weight"], W[m + "shared_expert.up_proj.weight"],
                               W[m + "shared_expert.down_proj.weight"])
            # Load-balancing loss (Switch/Mixtral): E * sum_e (assignments to e / T) * mean prob of e.
            counts = torch.zeros(E).index_add(0, topi.reshape(-1), torch.ones(topi.numel()))
            aux_total = aux_total + E * ((counts / T) * probs.mean(0)).sum()
        x = x + y
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T, aux_total


def loss_of(c, W, batch):
    logits, aux = forward(c, W, batch["tokens"], batch["cu"], batch["positions"])
    z = logits / TEMPERATURE
    logsm = z.log_softmax(-1)
    tgt = batch["targets"]
    valid = tgt >= 0
    logp = torch.where(valid, logsm.gather(1, tgt.clamp(min=0)[:, None])[:, 0], torch.zeros(()))
    entropy = -(logsm.exp() * logsm).sum(-1)
    loss = (batch["w"] * logp).sum() + (batch["u"] * entropy).sum() + c["router_aux_loss_coef"] * aux
    return loss, logits, logp, entropy, aux


def flat(t):
    return t.detach().double().reshape(-1).tolist()


def make(name, c, out_dir):
    g = torch.Generator().manual_seed(1234 + len(name))
    W = {}
    for n, shp in param_shapes(c).items():
        if n.endswith("norm.weight"):
            W[n] = (1.0 + 0.1 * torch.randn(shp, generator=g)).requires_grad_()
        else:
            W[n] = (0.15 * torch.randn(shp, generator=g)).requires_grad_()
    V = c["vocab_size"]
    tokens, targets, positions, cu = [], [], [], [0]
    for L in SEQ_LENS:
        seq = torch.randint(0, V, (L,), generator=g).tolist()
        tokens += seq
        targets += seq[1:] + [-1]
        positions += list(range(L))
        cu.append(len(tokens))
    T = len(tokens)
    batch = dict(tokens=torch.tensor(tokens), targets=torch.tensor(targets), positions=torch.tensor(positions), cu=cu,
                 w=torch.randn(T, generator=g), u=0.1 * torch.randn(T, generator=g))
    fixture = dict(config=c, tokens=tokens, targets=targets, cu_seqlens=cu, temperature=TEMPERATURE,
                   dlogp=flat(batch["w"]), dentropy=flat(batch["u"]), weights={n: flat(w) for n, w in W.items()},
                   shapes={n: list(w.shape) for n, w in W.items()})
    loss, logits, logp, entropy, aux = loss_of(c, W, batch)
    loss.backward()
    fixture.update(logits=flat(logits), logp=flat(logp), entropy=flat(entropy),
                   aux_loss=float(c["router_aux_loss_coef"] * aux), loss=float(loss),
                   grads={n: flat(w.grad) for n, w in W.items()})
    opt = torch.optim.AdamW(list(W.values()), lr=ADAMW["lr"], betas=ADAMW["betas"], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"])
    losses = []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        l, *_ = loss_of(c, W, batch)
        losses.append(float(l))
        l.backward()
        opt.step()
    losses.append(float(loss_of(c, W, batch)[0]))
    fixture["adamw"] = dict(lr=ADAMW["lr"], beta1=ADAMW["betas"][0], beta2=ADAMW["betas"][1], eps=ADAMW["eps"],
                            weight_decay=ADAMW["weight_decay"], losses=losses)
    with open(os.path.join(out_dir, f"golden_{name}.json"), "w") as f:
        json.dump(fixture, f)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out_dir, exist_ok=True)
    for name, c in CONFIGS.items():
        make(name, c, out_dir)
    print("wrote", ", ".join(f"golden_{n}.json" for n in CONFIGS), "to", out_dir)


if __name__ == "__main__":
    main()
