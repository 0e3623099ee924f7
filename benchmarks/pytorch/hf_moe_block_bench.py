"""Hugging Face's Mixtral sparse-MoE block on PyTorch CPU, forward + backward, at the shapes of
`moe_layer_bench` (same thread count), for the side-by-side ratio in the README.

    /tmp/hfenv/bin/python benchmarks/pytorch/hf_moe_block_bench.py --tokens 2048 --hidden 512 --ffn 1024 \
        --experts 8 --top-k 2 --threads 2 --json hf_moe.json
"""
import argparse
import json
import time

import torch
import transformers
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

p = argparse.ArgumentParser()
for name, default in [("tokens", 2048), ("hidden", 512), ("ffn", 1024), ("experts", 8), ("top-k", 2), ("iters", 10), ("threads", 2)]:
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--json")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
config = transformers.MixtralConfig(hidden_size=a.hidden, intermediate_size=a.ffn, num_local_experts=a.experts,
                                    num_experts_per_tok=a.top_k, router_jitter_noise=0.0)
block = MixtralSparseMoeBlock(config).float()
x = torch.randn(1, a.tokens, a.hidden, requires_grad=True)
times = []
for it in range(a.iters + 2):
    t0 = time.perf_counter()
    out = block(x)
    y = out[0] if isinstance(out, tuple) else out  # transformers 4 returns (y, router logits), 5 returns y
    y.sum().backward()
    if it >= 2:
        times.append(time.perf_counter() - t0)
    x.grad = None
    block.zero_grad()
times.sort()
median = times[len(times) // 2]
t, h, f, e, k = a.tokens, a.hidden, a.ffn, a.experts, a.top_k
flops = 3 * (2 * t * k * 3 * h * f + 2 * t * h * e)
doc = {"impl": f"transformers {transformers.__version__} MixtralSparseMoeBlock, torch {torch.__version__}",
       "threads": a.threads, "tokens": t, "hidden": h, "ffn": f, "experts": e, "top_k": k,
       "median_s": median, "gflops": flops / median / 1e9}
print(json.dumps(doc, indent=1))
if a.json:
    with open(a.json, "w") as fh:
        json.dump(doc, fh, indent=1)
