"""PyTorch's own accounting of a ResNet-50 training step's peak memory, and the largest
batch that fits a budget by it: what `graphc plan --train` / `graphc fit --train` on
ResNet-50 are compared with.

The step is torchvision's `resnet50` (224 x 224 images, 1000 classes, `train()` mode:
BatchNorm with batch statistics), cross-entropy, SGD with momentum 0.9 (`foreach`,
PyTorch's default), under bf16 autocast over f32 master weights (or plain f32). It runs
under `FakeTensorMode` on the CPU (no memory is allocated, no GPU is needed), tracked by
`torch.distributed._tools.mem_tracker.MemTracker`: two steps (the second holds the
momentum buffers the first made), the peak of all devices' bytes by PyTorch's classes.
The CPU autocast policy is the one fake tensors can run; on CUDA the convolutions and
matmuls are also bf16 and BatchNorm runs on the bf16 activations, as here.

The peak is about linear in the batch (A + b B): measured at two batches, the largest
b under the budget by the line, then measured at that b and b + 1.

    python3 scripts/pytorch_memtracker_resnet.py                    # bf16, batch 512
    python3 scripts/pytorch_memtracker_resnet.py --precision fp32 --batch 256

Needs torch and torchvision. Prints one JSON object.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
import torchvision
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

GiB = 1 << 30


def peak(precision, batch, size):
    """Peak bytes of the second of two training steps at `batch`, by class."""
    with FakeTensorMode():
        model = torchvision.models.resnet50(weights=None)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(batch, 3, size, size)
        y = torch.randint(0, 1000, (batch,))
        mt = MemTracker()
        mt.track_external(model, opt)
        with mt:
            for i in range(2):
                if i:
                    mt.reset_mod_stats()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--batch", type=int, default=None, help="the batch to report (default 512 bf16, 256 fp32)")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--budget-gib", type=float, default=24.0)
    ap.add_argument("--samples", type=int, nargs=2, default=[8, 16])
    args = ap.parse_args()
    batch = args.batch or (512 if args.precision == "bf16" else 256)
    t0 = time.time()
    a, b = args.samples
    pa, pb = peak(args.precision, a, args.size), peak(args.precision, b, args.size)
    per = (pb["total"] - pa["total"]) / (b - a)
    fixed = pa["total"] - a * per
    budget = int(args.budget_gib * GiB)
    largest = int((budget - fixed) // per)
    at = peak(args.precision, batch, args.size)
    out = {
        "model": "torchvision resnet50",
        "precision": args.precision,
        "image_size": args.size,
        "fixed_gib": round(fixed / GiB, 3),
        "per_image_mib": round(per / (1 << 20), 2),
        "largest_batch_by_the_line": largest,
        "budget_gib": args.budget_gib,
        "batch": batch,
        "peak_at_batch_gib": round(at["total"] / GiB, 3),
        "peak_at_batch_by_class_gib": {k: round(v / GiB, 3) for k, v in at.items()},
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
