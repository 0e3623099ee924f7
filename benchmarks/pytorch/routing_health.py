"""Routing health, side by side: does the expert load collapse in the first steps of training, in
Piper (`mixtral_train --data FILE`) and in Hugging Face's Mixtral on PyTorch, on the same bytes with the
same model (the `tiny` preset: d 64, 2 layers, 8 experts top-2, vocabulary 256), optimizer (AdamW β
0.9/0.95, ε 1e-8, decay 0.1, lr 3e-3 with 20 warm-up steps then cosine to 10%), clipping (1.0) and
load-balancing loss (0.01)? Per step and layer: tokens on the busiest expert ÷ the mean (4.0 = every
token on the same two experts).

    python benchmarks/pytorch/routing_health.py --data FILE --steps 60 --seeds 3 --piper PATH/mixtral_train --json OUT.json
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile

import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--piper", required=True, help="the mixtral_train binary")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--seeds", type=int, default=3)
p.add_argument("--json", required=True)
a = p.parse_args()
torch.set_num_threads(2)
LR, WARMUP, MIN_RATIO, BATCH, SEQ = 3e-3, 20, 0.1, 16, 63


def lr_at(step):
    """Piper's schedule (piper-burn runtime config): linear warm-up, then cosine to lr · 0.1."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min((step - WARMUP) / max(a.steps - WARMUP, 1), 1.0)
    low = LR * MIN_RATIO
    return low + 0.5 * (LR - low) * (1 + math.cos(math.pi * progress))


def hf_run(seed, data):
    torch.manual_seed(seed)
    config = transformers.MixtralConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, intermediate_size=128, num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.01,
        output_router_logits=True, tie_word_embeddings=False, rms_norm_eps=1e-6, router_jitter_noise=0.0)
    model = transformers.MixtralForCausalLM(config).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    loads = []
    for step in range(a.steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=gen)
        ids = torch.stack([data[s:s + SEQ + 1] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        per_layer = []
        for logits in out.router_logits:
            top = logits.detach().topk(2, dim=-1).indices.flatten()
            counts = torch.bincount(top, minlength=8).float()
            per_layer.append((counts.max() / counts.mean()).item())
        loads.append(per_layer)
    return loads


def piper_run(seed):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        subprocess.run([a.piper, "--data", a.data, "--steps", str(a.steps), "--batch-size", str(BATCH), "--seq-len",
                        str(SEQ), "--lr", str(LR), "--warmup", str(WARMUP), "--seed", str(seed), "--no-progress",
                        "--log-every", "0", "--metrics", metrics], check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line)["expert_load"] for line in open(metrics)]


data = torch.tensor(list(open(a.data, "rb").read()), dtype=torch.int64)
runs = {"pytorch": [hf_run(s, data) for s in range(a.seeds)], "piper": [piper_run(s) for s in range(a.seeds)]}
summary = {}
for name, seeds in runs.items():
    # Worst layer per step, median over seeds.
    worst = [statistics.median(max(run[t]) for run in seeds) for t in range(a.steps)]
    first_collapse = [next((t for t, l in enumerate(run) if max(l) >= 3.5), None) for run in seeds]
    summary[name] = {"worst_layer_median_over_seeds": worst, "first_step_at_3.5": first_collapse,
                     "at_steps": {t: worst[t] for t in (5, 10, 20, 40, a.steps - 1) if t < a.steps}}
    print(name, "first step with a layer ≥ 3.5:", first_collapse, "worst layer at steps", summary[name]["at_steps"])
with open(a.json, "w") as f:
    json.dump({"runs": runs, "summary": summary, "transformers": transformers.__version__, "torch": torch.__version__}, f)
