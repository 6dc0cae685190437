"""PyTorch's own accounting of a GPT-2 training step's peak memory, and the largest
batch that fits a budget by it: what `graphc fit --train` is compared with.

The step is Hugging Face's `GPT2LMHeadModel` (GPT-2-medium's shape by default: 24
layers, d 1024, 16 heads, vocab 50257, seq 1024), next-token cross-entropy, AdamW
(`foreach`, PyTorch's default), with bf16 autocast over f32 master weights (or plain
f32), with and without `model.gradient_checkpointing_enable()`. It runs under
`FakeTensorMode` on the CPU (no memory is allocated, no GPU is needed; CUDA fake
tensors cannot run a backward without a device), tracked by
`torch.distributed._tools.mem_tracker.MemTracker`: two steps (the second holds the
optimizer state and the gradients the first made), the peak of all devices' bytes by
PyTorch's classes (parameters, gradients, activations, temporaries, optimizer state).

The peak is about linear in the batch (A + b B): measured at two batches (--samples),
the largest b under the line is the first guess, then measured batches bracket and
bisect to the exact largest that fits.

    python3 scripts/pytorch_memtracker.py                      # bf16, both modes
    python3 scripts/pytorch_memtracker.py --precision fp32 --layers 48 --seq 64 --budget 2GiB

Needs torch and transformers (scripts/requirements-onnx.txt). Prints one JSON object
per mode and writes them to --out when given.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(s):
    for u in sorted(UNITS, key=len, reverse=True):
        if s.endswith(u):
            return int(float(s[: -len(u)]) * UNITS[u])
    return int(s)


def peak(args, batch, checkpointing):
    """Peak bytes of the second of two training steps at `batch`, by class."""
    with FakeTensorMode():
        cfg = transformers.GPT2Config(
            vocab_size=args.vocab, n_positions=max(1024, args.seq), n_embd=args.d, n_layer=args.layers,
            n_head=args.heads, resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
            use_cache=False,
        )
        model = transformers.GPT2LMHeadModel(cfg)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, cfg.vocab_size, (batch, args.seq))
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            for i in range(2):
                if i:
                    mt.reset_mod_stats()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    logits = model(input_ids=x).logits
                # Hugging Face's causal-LM loss: shifted, in f32.
                loss = F.cross_entropy(
                    logits[:, :-1].float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1)
                )
                loss.backward()
                opt.step()
                opt.zero_grad()
        snap = mt.get_tracker_snapshot("peak")
    total = {}
    for per_device in snap.values():
        for k, v in per_device.items():
            name = str(k).split(".")[-1].lower()
            total[name] = total.get(name, 0) + v
    return total


def fit(args, checkpointing):
    t0 = time.time()
    seen = {}

    def total(b):
        if b not in seen:
            seen[b] = peak(args, b, checkpointing)
            print(f"  batch {b}: {seen[b]['total']} B", file=sys.stderr, flush=True)
        return seen[b]["total"]

    # Two batches where the activations decide the peak (at a batch of 1 or 2 the
    # optimizer's step over parameters, gradients and moments can), for the line.
    a, b = args.samples
    pa, pb = total(a), total(b)
    per = (pb - pa) // (b - a)
    fixed = pa - a * per
    guess = max(1, (args.budget - fixed) // per) if per > 0 else 1
    # Bracket the answer around the line's guess, then bisect: lo fits, hi does not.
    lo, hi = (guess, guess + 1)
    step = 1
    while lo > 0 and total(lo) > args.budget:
        lo, hi = max(0, lo - step), lo
        step *= 2
    step = 1
    while total(hi) <= args.budget:
        lo, hi = hi, hi + step
        step *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if total(mid) <= args.budget:
            lo = mid
        else:
            hi = mid
    b = lo
    at, over = (seen[b] if b > 0 else None), seen[hi]
    return {
        "mode": "gradient_checkpointing_enable()" if checkpointing else "no checkpointing",
        "precision": args.precision,
        "layers": args.layers,
        "seq": args.seq,
        "budget_bytes": args.budget,
        "fixed_bytes": fixed,
        "per_sequence_bytes": per,
        "largest_batch": b,
        "at_largest": at,
        "at_next": over,
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--budget", type=parse_bytes, default=24 << 30)
    ap.add_argument("--mode", choices=["both", "off", "checkpointing"], default="both")
    ap.add_argument("--samples", type=int, nargs=2, default=[4, 8], metavar=("A", "B"),
                    help="the two batches measured for the line (default 4 8)")
    ap.add_argument("--out")
    args = ap.parse_args()
    modes = {"both": [False, True], "off": [False], "checkpointing": [True]}[args.mode]
    results = []
    for c in modes:
        r = fit(args, c)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
