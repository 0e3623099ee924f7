"""Hugging Face transformers training on PyTorch CPU — the baseline `benchmarks/train_vs_pytorch.sh` runs
beside `mixtral_train` on the same config.json: f32, AdamW (β 0.9/0.95, ε 1e-8, weight decay 0.1, the
runtime's defaults), global-norm clipping at 1.0, the load-balancing loss at the config's coefficient,
the same sequences × tokens per step and thread count. Also measures the dense GEMM rate of this
PyTorch (a 2048³ matmul) in the same process.

    python benchmarks/pytorch/hf_train_bench.py --config benchmarks/configs/train-mixtral-m.json --batch 16 --seq 128 \
        --steps 12 --threads 2 --json out.json
"""
import argparse
import json
import time

import torch
import transformers

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
for name, default in [("batch", 16), ("seq", 128), ("steps", 12), ("threads", 2), ("warmup", 3)]:
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--json")
a = p.parse_args()
if a.steps <= a.warmup:
    raise SystemExit(f"error: --steps ({a.steps}) must exceed --warmup ({a.warmup})")
torch.set_num_threads(a.threads)
torch.manual_seed(0)

with open(a.config) as f:
    raw = json.load(f)
config = transformers.AutoConfig.for_model(**raw)
config.output_router_logits = True  # the load-balancing loss joins the loss, as in mixtral_train
model = transformers.AutoModelForCausalLM.from_config(config).float()
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
gen = torch.Generator().manual_seed(1)


def dense_gemm_gflops(n=2048, reps=5):
    x, y = torch.randn(n, n), torch.randn(n, n)
    torch.mm(x, y)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(x, y)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / sorted(times)[len(times) // 2] / 1e9


times, losses = [], []
for step in range(a.steps):
    # seq + 1 ids per sequence: seq predicted positions, as mixtral_train's batches.
    ids = torch.randint(0, config.vocab_size, (a.batch, a.seq + 1), generator=gen)
    t0 = time.perf_counter()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    losses.append(out.loss.item())
    if step >= a.warmup:
        times.append(dt)
times.sort()
median = times[len(times) // 2]
doc = {
    "impl": f"transformers {transformers.__version__} {type(model).__name__}, torch {torch.__version__}",
    "config": a.config,
    "threads": a.threads,
    "batch": a.batch,
    "seq": a.seq,
    "steps": a.steps,
    "step_time_median_s": median,
    "tokens_per_s": a.batch * a.seq / median,
    "dense_gemm_gflops": dense_gemm_gflops(),
    "first_loss": losses[0],
    "last_loss": losses[-1],
}
print(json.dumps(doc, indent=1))
if a.json:
    with open(a.json, "w") as fh:
        json.dump(doc, fh, indent=1)
