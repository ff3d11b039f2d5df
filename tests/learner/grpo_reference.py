"""PyTorch reference of troupe's GRPO/SFT losses and group advantages, written from the formulas
(TRL GRPOTrainer._compute_loss, veRL core_algos, NeMo RL calculate_kl) in float64 with autograd.

Usage: grpo_reference.py CASES.json  -- reads the cases and troupe's outputs written by
learner.grpo_torch_parity (and the loss.mismatch_correction cases of learner.mismatch_corrections),
recomputes every one, prints the worst errors and exits 1 on a mismatch.
Tolerance: |ours - ref| <= atol + rtol*|ref| with atol 1e-7, rtol 1e-5 for gradients (ours are
fp32), 1e-9 / 1e-7 for losses (ours are accumulated in double from fp32 inputs)."""
import json
import math
import sys

import torch

torch.set_num_threads(2)
D = torch.float64


def padded(flat, cu):
    """(T) packed -> (S, Lmax) padded with zeros, like TRL's batch layout."""
    S = len(cu) - 1
    L = max(cu[s + 1] - cu[s] for s in range(S))
    out = torch.zeros(S, L, dtype=D)
    for s in range(S):
        n = cu[s + 1] - cu[s]
        out[s, :n] = torch.tensor(flat[cu[s]:cu[s + 1]], dtype=D)
    return out


def unpad(x, cu):
    return torch.cat([x[s, : cu[s + 1] - cu[s]] for s in range(len(cu) - 1)])


def kl_estimate(logp, ref, c):
    logr = ref - logp
    if c["kl_input_clamp"] > 0:
        logr = logr.clamp(min=-c["kl_input_clamp"], max=c["kl_input_clamp"])
    k = c["kl_type"]
    if k == "k1":
        kl = -logr
    elif k == "k2":
        kl = logr.square() / 2
    else:
        kl = torch.exp(logr) - 1 - logr
    if c["kl_output_clamp"] > 0:
        kl = kl.clamp(min=-c["kl_output_clamp"], max=c["kl_output_clamp"])
    return kl


def correction_weights(case, mask, learner, sampler):
    """The detached weight of loss.mismatch_correction, from the published rules, rho = pi_learner / pi_sampler:
    tis (truncated IS, Yao et al. 2025): min(rho, C); mis (masked IS, Liu et al. 2025): rho * 1[lo <= rho <= hi];
    seq_geo_mask (veRL's geometric rejection): 1[lo <= exp(mean_t log rho_t) <= hi] for the whole sequence;
    icepop (IcePop's M(k; alpha, beta)): rho * 1[alpha <= rho <= beta]."""
    k = case["correction"]
    log_rho = (learner - sampler) * mask
    rho = torch.exp(log_rho)
    mode = k["mode"]
    if mode == "tis":
        w = torch.clamp(rho, max=k["tis_cap"])
    elif mode == "mis":
        w = rho * ((rho >= k["mis_low"]) & (rho <= k["mis_high"])).to(D)
    elif mode == "icepop":
        w = rho * ((rho >= k["icepop_low"]) & (rho <= k["icepop_high"])).to(D)
    elif mode == "seq_geo_mask":
        geo = torch.exp(log_rho.sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        w = ((geo >= k["geo_mask_low"]) & (geo <= k["geo_mask_high"])).to(D).expand_as(mask)
    else:
        raise ValueError(mode)
    return (w * mask).detach().to(torch.float32).to(D)  # troupe rounds each weight once to fp32


def grpo(case):
    c, cu = case["config"], case["cu_seqlens"]
    mask = padded(case["mask"], cu)
    logp = padded(case["logp"], cu).requires_grad_(True)
    old = padded(case["old"], cu) if case["old"] is not None else logp.detach()
    ent = padded(case["entropy"], cu).requires_grad_(True) if case["entropy"] is not None else None
    A = torch.tensor(case["advantages"], dtype=D).unsqueeze(1)
    weights = None
    if case.get("sampler") is not None:  # a mismatch correction: its weight of pi_old (else pi_current) / pi_sampler
        weights = correction_weights(case, mask, old.detach(), padded(case["sampler"], cu))

    log_ratio = logp - old
    if c["sequence_level_ratio"]:  # GSPO
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    if c["log_ratio_clamp"] > 0:  # veRL clamps the log-ratio to +-20
        log_ratio = log_ratio.clamp(-c["log_ratio_clamp"], c["log_ratio_clamp"])
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - c["clip_low"], 1 + c["clip_high"])
    ratio_for_metrics = coef_1
    if c["two_sided_clip"] > 0:
        coef_1 = torch.clamp(coef_1, max=c["two_sided_clip"])
    per_tok = -torch.min(coef_1 * A, coef_2 * A)
    if c["dual_clip"] > 1:  # veRL dual clip for A < 0
        per_tok = torch.where(A < 0, torch.min(-A * c["dual_clip"], per_tok), per_tok)
    if weights is not None:  # on the policy-gradient term only (not KL, not entropy)
        per_tok = per_tok * weights
    kl = None
    if case["ref"] is not None:
        kl = kl_estimate(logp, padded(case["ref"], cu), c)
        if c["kl_coef"] != 0:
            per_tok = per_tok + c["kl_coef"] * kl
    if ent is not None:
        per_tok = per_tok - c["entropy_coef"] * ent
    per_tok = per_tok.expand_as(mask)

    mode, nt, ns = c["agg_mode"], case["num_tokens"], case["num_seqs"]
    if mode == "token-mean":
        loss = (per_tok * mask).sum() / nt
    elif mode == "seq-mean-token-mean":
        loss = ((per_tok * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / ns
    elif mode == "seq-mean-token-sum":
        loss = (per_tok * mask).sum(-1).sum() / ns
    elif mode == "seq-mean-token-sum-norm":
        loss = (per_tok * mask).sum() / (ns * c["agg_norm_length"])
    else:
        raise ValueError(mode)
    loss.backward()

    tokens = mask.sum()
    r = ratio_for_metrics.detach().expand_as(mask)
    out = {
        "loss": loss.item(),
        "dlogp": unpad(logp.grad, cu),
        "clip_frac_low": (((r < 1 - c["clip_low"]) & (A < 0)).to(D) * mask).sum().item() / tokens.item(),
        "clip_frac_high": (((r > 1 + c["clip_high"]) & (A > 0)).to(D) * mask).sum().item() / tokens.item(),
    }
    if kl is not None:
        out["kl"] = ((kl.detach() * mask).sum() / tokens).item()
    if weights is not None:
        out["weights"] = unpad(weights, cu)
        out["is_weight_mean"] = (weights.sum() / tokens).item()
    if ent is not None:
        out["dentropy"] = unpad(ent.grad, cu)
        out["entropy"] = ((ent.detach() * mask).sum() / tokens).item()
    return out


def sft(case):
    cu = case["cu_seqlens"]
    mask = padded(case["mask"], cu)
    logp = padded(case["logp"], cu).requires_grad_(True)
    loss = -(logp * mask).sum() / case["num_tokens"]
    loss.backward()
    return {"loss": loss.item(), "dlogp": unpad(logp.grad, cu)}


def nanstd(x):  # TRL's nanstd: unbiased
    n = (~torch.isnan(x)).sum()
    if n < 2:
        return torch.tensor(0.0, dtype=D)
    m = torch.nanmean(x)
    return torch.sqrt(torch.nansum((x - m) ** 2) / (n - 1))


def advantages(case):
    G = case["group_size"]
    r = torch.tensor(case["rewards"], dtype=D) * torch.tensor(case["reward_scale"], dtype=torch.float32).item()
    r = r.to(torch.float32).to(D)  # troupe scales in fp32
    if case["reward_clip"] > 0:
        r = r.clamp(-case["reward_clip"], case["reward_clip"])
    eps = torch.tensor(case["std_eps"], dtype=torch.float32).item()
    rg = r.view(-1, G)
    adv = torch.zeros_like(rg)
    batch_std = nanstd(r)
    for g in range(rg.shape[0]):
        x = rg[g]
        live = x[~torch.isnan(x)]
        if live.numel() < 2 or bool((live == live[0]).all()):
            continue  # G = 1 or all equal: no signal, A = 0
        mean = live.mean()
        if case["adv_estimator"] == "rloo":
            a = (x - mean) * live.numel() / (live.numel() - 1)  # r_i - mean of the others
        else:
            a = x - mean
            if case["adv_estimator"] == "grpo":
                if case["scale_rewards"] == "group":
                    a = a / (nanstd(x) + eps)
                elif case["scale_rewards"] == "batch":
                    a = a / (batch_std + eps)
        adv[g] = torch.nan_to_num(a, nan=0.0)
    adv = adv.view(-1)
    if case["adv_estimator"] == "reinforce_pp":
        s = nanstd(adv)
        if s > 0:
            adv = (adv - adv.mean()) / (s + eps)
    return adv


def close(ours, ref, atol, rtol):
    ours = torch.as_tensor(ours, dtype=D)
    ref = torch.as_tensor(ref, dtype=D)
    err = (ours - ref).abs()
    bound = atol + rtol * ref.abs()
    return bool((err <= bound).all()), float(err.max()) if err.numel() else 0.0


def main():
    cases = json.load(open(sys.argv[1]))["cases"]
    failures, worst = 0, {}
    for i, case in enumerate(cases):
        kind = case["kind"]
        ours = case["ours"]
        checks = []
        if kind in ("grpo", "correction"):
            ref = grpo(case)
            checks += [("loss", ours["loss"], ref["loss"], 1e-9, 1e-7),
                       ("dlogp", ours["dlogp"], ref["dlogp"], 1e-7, 1e-5),
                       ("clip_frac_low", ours["clip_frac_low"], ref["clip_frac_low"], 1e-12, 0),
                       ("clip_frac_high", ours["clip_frac_high"], ref["clip_frac_high"], 1e-12, 0)]
            if "kl" in ref:
                checks.append(("kl", ours["kl"], ref["kl"], 1e-9, 1e-7))
            if "dentropy" in ref:
                checks += [("dentropy", ours["dentropy"], ref["dentropy"], 1e-7, 1e-5),
                           ("entropy", ours["entropy"], ref["entropy"], 1e-9, 1e-7)]
            if "weights" in ref:
                checks += [("weights", ours["weights"], ref["weights"], 1e-7, 1e-6),
                           ("is_weight_mean", ours["is_weight_mean"], ref["is_weight_mean"], 1e-9, 1e-6)]
            cfg = case["config"]
            if kind == "correction":
                cfg = dict(cfg, agg_mode=case["correction"]["mode"] + " " + cfg["agg_mode"])
            label = "grpo[%s %s seq=%s clip=%g/%g two_sided=%g dual=%g kl_coef=%g]" % (
                cfg["agg_mode"], cfg["kl_type"], cfg["sequence_level_ratio"], cfg["clip_low"], cfg["clip_high"],
                cfg["two_sided_clip"], cfg["dual_clip"], cfg["kl_coef"])
        elif kind == "sft":
            ref = sft(case)
            checks += [("loss", ours["loss"], ref["loss"], 1e-9, 1e-7), ("dlogp", ours["dlogp"], ref["dlogp"], 1e-7, 1e-5)]
            label = "sft"
        else:
            ref = advantages(case)
            checks.append(("advantages", ours, ref, 1e-6, 1e-5))
            label = "advantages[%s %s G=%d]" % (case["adv_estimator"], case["scale_rewards"], case["group_size"])
        for name, o, r, atol, rtol in checks:
            ok, err = close(o, r, atol, rtol)
            key = kind + "." + name
            worst[key] = max(worst.get(key, 0.0), err)
            if not ok:
                failures += 1
                print("MISMATCH case %d %s %s: max |err| %.3g\n  ours %s\n  ref  %s" % (i, label, name, err, o, r))
    for k in sorted(worst):
        print("  %-26s max |ours - torch| = %.3g" % (k, worst[k]))
    print("grpo_reference: %d cases, %d mismatches" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
