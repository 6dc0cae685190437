#!/usr/bin/env python3
"""PyTorch references for graphc's training steps.

Usage (the virtualenv of scripts/README.md: torch, transformers, onnx, onnxscript):

    python scripts/train_refs.py [--out tests/fixtures/train] [NAME ...]

For each NAME (mlp, gpt2, gpt2_sdpa, bert, llama; all by default) this builds a tiny
model with fixed-seed random weights, exports its forward graph to ONNX so that every
parameter stays its own initializer (torch.onnx.export(dynamo=True, optimize=False):
the default optimization drops zero biases and merges equal LayerNorm parameters),
then trains a copy in PyTorch for 3 SGD steps and another for 3 AdamW steps on one
batch, and writes OUT/NAME/:

    model.onnx      the forward graph (parameters as initializers, named as in the
                    model's named_parameters())
    inputs.npz      the model's inputs and the target array
    sgd.npz         losses [3] (each before its step's update), every parameter
    adamw.npz       after the 3 steps by initializer name; adamw.npz also the first
                    step's gradients as grad.NAME
    bf16_adamw.npz  3 AdamW steps under torch.autocast(bfloat16), f32 master weights
    fp16_adamw.npz  the same in float16 with torch.amp.GradScaler (scales, skipped)
    fp16_overflow.npz  6 fp16 steps from a scale that overflows (mixed_precision)
    meta.json       the loss and optimizer options (graphc train's flags), versions

`gpt2_medium` (on demand only, into an ignored folder: `--out target/models`) exports
GPT-2-medium's LM with dynamic batch and seq, and writes PyTorch's own accounting of
its training step (pytorch_accounting.json).

Losses: mse (mean); cross-entropy as torch.nn.functional.cross_entropy over the last
axis (mean over labels != -100); for causal LMs the logits[:, :-1] / labels[:, 1:]
shift Hugging Face applies. Dropout is 0, so train and eval modes agree.
"""
import argparse
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
import transformers

SEED = 0
B, S, V = 2, 24, 128


class Logits(torch.nn.Module):
    def __init__(self, m, **kw):
        super().__init__()
        self.m = m
        self.kw = kw

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, return_dict=True, **self.kw).logits


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc0 = torch.nn.Linear(16, 32)
        self.fc1 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc1(F.gelu(self.fc0(x)))


class Cnn(torch.nn.Module):
    """A small CNN with BatchNorm: conv-BN-ReLU, a strided conv-BN, a residual block, max
    and average pooling, global average pooling and a linear head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.c0 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.b0 = nn.BatchNorm2d(8)
        self.c1 = nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)
        self.b2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(3, stride=1, padding=1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = F.relu(self.b0(self.c0(x)))
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(x + self.b2(self.c2(x)))
        x = self.avg(self.pool(x))
        return self.fc(x.mean(dim=(2, 3)))


def perturb(model, seed):
    """Every parameter distinct (HF init leaves norm scales at 1, biases at 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def ids(g):
    return torch.randint(0, V, (B, S), generator=g)


def mlp(g):
    model = Mlp()
    x = torch.randn(4, 16, generator=g)
    y = torch.randn(4, 8, generator=g)
    return model, {"x": x}, ("y", y), dict(loss="mse", shift=False)


def cnn(g):
    model = Cnn()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    x = torch.randn(4, 3, 12, 12, generator=g)
    y = torch.randn(4, 5, generator=g)
    return model, {"x": x}, ("y", y), dict(loss="mse", shift=False)


def gpt2(g, attn="eager"):
    cfg = transformers.GPT2Config(
        vocab_size=V, n_positions=32, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation=attn,
    )
    model = Logits(transformers.GPT2LMHeadModel(cfg), use_cache=False)
    x = ids(g)
    return model, {"input_ids": x}, ("labels", x.clone()), dict(loss="cross-entropy", shift=True)


def bert(g):
    cfg = transformers.BertConfig(
        vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = Logits(transformers.BertForMaskedLM(cfg))
    x = ids(g)
    labels = torch.full((B, S), -100)
    pick = torch.rand(B, S, generator=g) < 0.3
    pick[:, 0] = True
    labels[pick] = x[pick]
    return model, {"input_ids": x}, ("labels", labels), dict(loss="cross-entropy", shift=False)


def llama(g):
    cfg = transformers.LlamaConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        use_cache=False, attention_dropout=0.0,
    )
    model = Logits(transformers.LlamaForCausalLM(cfg), use_cache=False)
    x = ids(g)
    return model, {"input_ids": x}, ("labels", x.clone()), dict(loss="cross-entropy", shift=True)


MODELS = {
    "mlp": mlp,
    "cnn": cnn,
    "gpt2": gpt2,
    "gpt2_sdpa": lambda g: gpt2(g, "sdpa"),
    "bert": bert,
    "llama": llama,
}

OPTIMIZERS = {
    "sgd": dict(optimizer="sgd", lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "adamw": dict(optimizer="adamw", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01),
}


def loss_of(out, target, how):
    if how["loss"] == "mse":
        return F.mse_loss(out, target)
    if how["shift"]:
        out, target = out[:, :-1], target[:, 1:]
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1), ignore_index=-100)


def make_optimizer(params, o):
    if o["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], dampening=o["dampening"],
                               weight_decay=o["weight_decay"])
    return torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
                             weight_decay=o["weight_decay"])


def one(name, root):
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    model, inputs, (tname, target), how = MODELS[name](g)
    perturb(model, SEED + 1)
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (), kwargs=inputs, f=str(out / "model.onnx"), dynamo=True,
                          optimize=False,
                          input_names=list(inputs), output_names=["out"], external_data=False)
    proto = onnx.load(str(out / "model.onnx"))
    inits = {i.name for i in proto.graph.initializer}
    # Each parameter by the name its initializer has (a tied weight, as GPT-2's
    # embedding and LM head, is one initializer under one of its names).
    aliases = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    names = {}
    for n, p in model.named_parameters():
        found = [a for a in aliases[id(p)] if a in inits]
        if not found:
            raise RuntimeError(f"{name}: parameter {n} is not exported as an initializer")
        names[found[0]] = n
    np.savez(out / "inputs.npz", **{k: v.numpy() for k, v in inputs.items()}, **{tname: target.numpy()})
    meta = {"target": tname, **how, "optimizers": OPTIMIZERS, "torch": torch.__version__,
            "transformers": transformers.__version__, "parameters": list(names)}
    for oname, o in OPTIMIZERS.items():
        m = copy.deepcopy(model)
        m.train()
        opt = make_optimizer(m.parameters(), o)
        losses = []
        params = dict(m.named_parameters())
        first_grads = {}
        for k in range(3):
            opt.zero_grad()
            loss = loss_of(m(**inputs), target, how)
            losses.append(loss.item())
            loss.backward()
            if k == 0:
                first_grads = {i: params[n].grad.detach().numpy().copy() for i, n in names.items()}
            opt.step()
        arrays = {"losses": np.array(losses, dtype=np.float64)}
        # The first step's gradients: where one is 0 in exact arithmetic (attention's key
        # bias: softmax ignores a shift of a row), AdamW turns rounding noise into
        # full-size updates, which no two implementations share; the test knows them so.
        if oname == "adamw":
            for i, gr in first_grads.items():
                arrays["grad." + i] = gr.astype(np.float32)
        for init_name, n in names.items():
            arrays[init_name] = params[n].detach().numpy().astype(np.float32)
        # BatchNorm's running statistics after the steps (buffers, by module path).
        for n, buf in m.named_buffers():
            if n.endswith("running_mean") or n.endswith("running_var"):
                arrays["running." + n] = buf.detach().numpy().astype(np.float32)
        np.savez(out / f"{oname}.npz", **arrays)
        meta[f"{oname}_losses"] = losses
    meta["amp"] = mixed_precision(model, inputs, target, how, names, out)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{name}: {len(names)} parameters, losses sgd {meta['sgd_losses']}, adamw {meta['adamw_losses']}; {size} bytes")


def amp_steps(model, inputs, target, how, names, dtype, steps, scaler_opts=None):
    """`steps` AdamW steps under torch.autocast(dtype) with f32 parameters (the master
    weights); the loss in f32 on the upcast output (as Hugging Face's loss functions
    upcast the logits); with `scaler_opts`, fp16's torch.amp.GradScaler. Returns the
    arrays: losses, the scale each step used and whether it was skipped, parameters."""
    m = copy.deepcopy(model)
    m.train()
    opt = make_optimizer(m.parameters(), OPTIMIZERS["adamw"])
    scaler = torch.amp.GradScaler("cpu", **scaler_opts) if scaler_opts else None
    losses, scales, skipped = [], [], []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            out = m(**inputs)
        loss = loss_of(out.float(), target, how)
        losses.append(loss.item())
        if scaler is None:
            loss.backward()
            opt.step()
            continue
        used = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(used)
        skipped.append(scaler.get_scale() < used)
    params = dict(m.named_parameters())
    arrays = {"losses": np.array(losses, dtype=np.float64)}
    if scaler is not None:
        arrays["scales"] = np.array(scales, dtype=np.float64)
        arrays["skipped"] = np.array(skipped, dtype=np.bool_)
        arrays["final_scale"] = np.array(scaler.get_scale(), dtype=np.float64)
    for init_name, n in names.items():
        arrays[init_name] = params[n].detach().numpy().astype(np.float32)
    return arrays


def overflow_threshold(model, inputs, target, how):
    """The smallest loss scale (to 1%) at which the first fp16 step's gradients hold an
    inf or NaN, by bisection (the step is skipped at and above it)."""
    def overflows(scale):
        m = copy.deepcopy(model)
        m.train()
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(**inputs)
        (loss_of(out.float(), target, how) * scale).backward()
        return any(not torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)

    lo, hi = 1.0, 2.0 ** 100
    while hi / lo > 1.01:
        mid = (lo * hi) ** 0.5
        if overflows(mid):
            hi = mid
        else:
            lo = mid
    return hi


def mixed_precision(model, inputs, target, how, names, out):
    """bf16 (autocast, no scaling) and fp16 (autocast + GradScaler) AdamW references:
    bf16_adamw.npz and fp16_adamw.npz (3 steps, GradScaler's defaults), and
    fp16_overflow.npz: 6 steps from an initial scale 2.8x the first step's overflow
    threshold with a growth interval of 2, so that steps 1 and 2 are skipped (at 2.8
    and 1.4 times the threshold), 3 and 4 run at 0.7 times it, the scale then doubles
    and step 5 is skipped again; every decision 30% or more away from the threshold."""
    np.savez(out / "bf16_adamw.npz", **amp_steps(model, inputs, target, how, names, torch.bfloat16, 3))
    np.savez(out / "fp16_adamw.npz", **amp_steps(model, inputs, target, how, names, torch.float16, 3,
                                                 dict(init_scale=2.0 ** 16)))
    threshold = overflow_threshold(model, inputs, target, how)
    init = float(np.float32(2.8 * threshold))
    over = amp_steps(model, inputs, target, how, names, torch.float16, 6,
                     dict(init_scale=init, growth_interval=2))
    # The losses, scales and skipped steps (the parameters are checked by the other two).
    np.savez(out / "fp16_overflow.npz", **{k: over[k] for k in ("losses", "scales", "skipped", "final_scale")})
    return {"autocast": "cpu", "overflow_threshold": threshold,
            "overflow_init_scale": init, "overflow_growth_interval": 2,
            "overflow_skipped": [bool(x) for x in over["skipped"]],
            "overflow_scales": [float(x) for x in over["scales"]]}


def gpt2_medium(root, seq=1024):
    """On demand (never committed): GPT-2-medium's LM (24 layers, d 1024, 16 heads, the
    real vocabulary, tied embedding), random weights, exported with dynamic batch and
    seq and every parameter its own initializer (1.4 GB of external data), for
    `graphc plan --train`; and PyTorch's own accounting of one training step at batch
    1: parameter, gradient and AdamW moment bytes, and the bytes autograd saves for the
    backward pass of one sequence (torch.autograd.graph.saved_tensors_hooks, each
    storage counted once)."""
    cfg = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False, attn_implementation="sdpa",
    )
    torch.manual_seed(SEED)
    model = Logits(transformers.GPT2LMHeadModel(cfg), use_cache=False)
    out = root / "gpt2_medium_lm"
    out.mkdir(parents=True, exist_ok=True)
    # An example batch of 2: torch.export specializes a dim of size 1 (batch would not
    # stay symbolic).
    x2 = torch.randint(0, cfg.vocab_size, (2, seq))
    x = x2[:1]
    batch, s = torch.export.Dim("batch", max=4096), torch.export.Dim("seq", max=1024)
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (), kwargs={"input_ids": x2}, f=str(out / "model.onnx"), dynamo=True,
                          optimize=False, input_names=["input_ids"], output_names=["logits"],
                          dynamic_shapes={"input_ids": {0: batch, 1: s}}, external_data=True)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    seen, saved = set(), [0]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen:
            seen.add(key)
            saved[0] += t.untyped_storage().nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(input_ids=x)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved_params = sum(n for (ptr, n) in seen if ptr in param_ptrs)
    meta = {"parameters_bytes": params, "gradients_bytes": params, "adamw_moments_bytes": 2 * params,
            "saved_for_backward_bytes_per_sequence": saved[0] - saved_params, "seq": seq,
            "loss": loss.item(), "torch": torch.__version__}
    (out / "pytorch_accounting.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/train")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    for n in a.names or list(MODELS):
        if n == "gpt2_medium":
            gpt2_medium(Path(a.out))
        else:
            one(n, Path(a.out))


if __name__ == "__main__":
    sys.exit(main())
