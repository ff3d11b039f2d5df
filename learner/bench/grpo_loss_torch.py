"""PyTorch eager baseline of `troupe bench learner` grpo_loss_fused: the same GRPO loss (TRL
_compute_loss layout: padded (B, L), clip-higher, k3 KL, entropy bonus, token-mean) forward +
backward in float32 on the CPU. Usage: grpo_loss_torch.py DIR  (DIR holds meta.json and the raw
float32 arrays the suite wrote). Prints one line: tokens_per_s (median of 3 timed runs after a warm-up)."""
import json
import os
import sys
import time

import numpy as np
import torch

torch.set_num_threads(int(os.environ.get("TROUPE_TORCH_THREADS", "1")))


def main():
    d = sys.argv[1]
    meta = json.load(open(os.path.join(d, "meta.json")))
    B, L = meta["S"], meta["L"]

    def load(name):
        return torch.from_numpy(np.fromfile(os.path.join(d, name + ".f32"), dtype=np.float32).reshape(B, L))

    mask, logp0, old, ref, ent0 = (load(n) for n in ("mask", "logp", "old", "ref", "entropy"))
    adv = torch.from_numpy(np.fromfile(os.path.join(d, "adv.f32"), dtype=np.float32)).unsqueeze(1)
    eps_low, eps_high, beta, ent_coef = meta["clip_low"], meta["clip_high"], meta["kl_coef"], meta["entropy_coef"]
    num_tokens = float(mask.sum())

    def step():
        logp = logp0.clone().requires_grad_(True)
        ent = ent0.clone().requires_grad_(True)
        coef_1 = torch.exp(logp - old)
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        per_tok = -torch.min(coef_1 * adv, coef_2 * adv)
        logr = ref - logp
        kl = torch.exp(logr) - logr - 1
        per_tok = per_tok + beta * kl - ent_coef * ent
        loss = (per_tok * mask).sum() / num_tokens
        # the metrics troupe's fused op also returns
        with torch.no_grad():
            _ = (kl * mask).sum() / num_tokens
            _ = (((coef_1 < 1 - eps_low) & (adv < 0)).float() * mask).sum()
            _ = (((coef_1 > 1 + eps_high) & (adv > 0)).float() * mask).sum()
            _ = (ent * mask).sum()
        loss.backward()
        return logp.grad, ent.grad

    step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    print("tokens_per_s %.6g" % (meta["T"] / times[1]))


if __name__ == "__main__":
    main()
