#!/usr/bin/env python3
"""Training on the GPU (step b1 of gpu_check.sh): graphc's training steps against
PyTorch's, and a training step's time against PyTorch eager and torch.compile.

1. Correctness: for every reference of tests/fixtures/train (scripts/train_refs.py:
   an MLP, GPT-2 eager and SDPA, BERT, Llama; 3 SGD and 3 AdamW steps), run
   `graphc train --device cuda --steps 3 --output ...` and compare each step's loss and
   every parameter after the third with PyTorch's (relative error 1e-4; AdamW's
   elements whose first-step gradient is 0 in exact arithmetic, within 1.5 lr a step).
   Mixed precision: 3 AdamW steps with --precision bf16 and fp16 (dynamic loss
   scaling) against PyTorch autocast (+ GradScaler) references (bf16_adamw.npz,
   fp16_adamw.npz: relative 2e-2), and 6 fp16 steps from an overflowing scale
   (fp16_overflow.npz: the same steps skipped, the same scales).
2. Time: a GPT-2-small-shaped LM (12 layers, d 768, 12 heads, vocab 50257; batch 4,
   seq 512, AdamW), exported as train_refs.py exports, one training step (forward,
   cross-entropy, backward, AdamW) in f32 and in bf16 (PyTorch: autocast) in PyTorch
   eager and under torch.compile (medians of CUDA-event timings), and graphc train's
   median step (wall clock).

Writes OUT/train_check.{json,md}.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def plain(o):
    """JSON for numpy's scalars (a comparison gives np.bool_, a norm np.float64)."""
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def compare(name, opt, meta, ref, got_npz, losses):
    out = {"model": name, "optimizer": opt}
    want = ref["losses"]
    errs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, want)]
    out["loss_rel"] = max(errs) if errs else None
    got = np.load(got_npz)
    lr = meta["optimizers"]["adamw"]["lr"] if opt == "adamw" else None
    top = max((np.abs(ref[k]).max() for k in ref.files if k.startswith("grad.")), default=0.0)
    worst = 0.0
    for k in meta["parameters"]:
        g, w = got[k].astype(np.float64).copy(), ref[k].astype(np.float64).copy()
        if lr is not None and ("grad." + k) in ref.files:
            noise = np.abs(ref["grad." + k]) <= 1e-6 * top
            if np.any(np.abs(g[noise] - w[noise]) > 1.5 * lr * 3):
                worst = float("inf")
            g[noise] = 0.0
            w[noise] = 0.0
        worst = max(worst, float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)))
    out["param_rel_l2"] = worst
    out["ok"] = bool(len(losses) == 3 and out["loss_rel"] <= 1e-4 and worst <= 1e-4)
    return out


def correctness(root, graphc, scratch, timeout):
    rows = []
    for d in sorted((root / "tests/fixtures/train").iterdir()):
        meta = json.loads((d / "meta.json").read_text())
        for opt, o in meta["optimizers"].items():
            args = [graphc, "train", str(d / "model.onnx"), "--inputs", str(d / "inputs.npz"),
                    "--loss", meta["loss"], "--target", meta["target"], "--optimizer", opt,
                    "--lr", str(o["lr"]), "--weight-decay", str(o["weight_decay"]), "--steps", "3",
                    "--device", os.environ.get("TRAIN_DEVICE", "cuda"), "--output", str(scratch / f"{d.name}_{opt}.npz")]
            if meta["shift"]:
                args.append("--shift-labels")
            if opt == "sgd":
                args += ["--momentum", str(o["momentum"]), "--dampening", str(o["dampening"])]
            else:
                args += ["--betas", f"{o['betas'][0]},{o['betas'][1]}", "--eps", str(o["eps"])]
            t0 = time.time()
            try:
                p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
                losses = [float(l.split()[3]) for l in p.stdout.splitlines() if l.startswith("step ")]
                if p.returncode != 0:
                    rows.append({"model": d.name, "optimizer": opt, "ok": False,
                                 "error": (p.stderr or p.stdout).strip()[-400:]})
                    continue
                r = compare(d.name, opt, meta, np.load(d / f"{opt}.npz"), scratch / f"{d.name}_{opt}.npz", losses)
            except Exception as e:  # noqa: BLE001 - recorded, the next model runs
                r = {"model": d.name, "optimizer": opt, "ok": False, "error": repr(e)[-400:]}
            r["seconds"] = round(time.time() - t0, 1)
            rows.append(r)
            print(json.dumps(r, default=plain), flush=True)
    return rows


def parse_steps(stdout):
    """(loss, scale or None, skipped) of each `step N loss X [scale S [skipped: ..]]`."""
    out = []
    for line in stdout.splitlines():
        if not line.startswith("step "):
            continue
        w = line.split()
        scale = float(w[5]) if len(w) > 5 and w[4] == "scale" else None
        out.append((float(w[3]), scale, "skipped:" in line))
    return out


def amp_rows(root, graphc, scratch, timeout):
    """bf16 and fp16 training against PyTorch autocast / GradScaler (see the doc)."""
    rows = []
    for d in sorted((root / "tests/fixtures/train").iterdir()):
        meta = json.loads((d / "meta.json").read_text())
        if "amp" not in meta:
            continue
        o = meta["optimizers"]["adamw"]
        for mode in ["bf16", "fp16", "fp16_overflow"]:
            ref_file = {"bf16": "bf16_adamw.npz", "fp16": "fp16_adamw.npz", "fp16_overflow": "fp16_overflow.npz"}[mode]
            ref = np.load(d / ref_file)
            steps = len(ref["losses"])
            out_npz = scratch / f"{d.name}_{mode}.npz"
            args = [graphc, "train", str(d / "model.onnx"), "--inputs", str(d / "inputs.npz"),
                    "--loss", meta["loss"], "--target", meta["target"], "--optimizer", "adamw",
                    "--lr", str(o["lr"]), "--weight-decay", str(o["weight_decay"]),
                    "--betas", f"{o['betas'][0]},{o['betas'][1]}", "--eps", str(o["eps"]),
                    "--steps", str(steps), "--precision", mode.split("_")[0],
                    "--device", os.environ.get("TRAIN_DEVICE", "cuda"), "--output", str(out_npz)]
            if meta["shift"]:
                args.append("--shift-labels")
            if mode == "fp16_overflow":
                args += ["--init-scale", repr(meta["amp"]["overflow_init_scale"]),
                         "--growth-interval", str(meta["amp"]["overflow_growth_interval"])]
            r = {"model": d.name, "optimizer": mode}
            t0 = time.time()
            try:
                p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
                got = parse_steps(p.stdout)
                if p.returncode != 0 or len(got) != steps:
                    r.update(ok=False, error=(p.stderr or p.stdout).strip()[-400:])
                else:
                    want = ref["losses"]
                    r["loss_rel"] = max(abs(g[0] - w) / max(abs(w), 1e-12) for g, w in zip(got, want))
                    ok = r["loss_rel"] <= 2e-2
                    if "scales" in ref.files:
                        ok &= all(np.float32(g[1]) == np.float32(w) for g, w in zip(got, ref["scales"]))
                        ok &= all(g[2] == bool(w) for g, w in zip(got, ref["skipped"]))
                        r["skipped"] = [g[2] for g in got]
                    if mode != "fp16_overflow":
                        grads = np.load(d / "adamw.npz")
                        top = max((np.abs(grads[k]).max() for k in grads.files if k.startswith("grad.")), default=0.0)
                        gotp, worst = np.load(out_npz), 0.0
                        for k in meta["parameters"]:
                            g, w = gotp[k].astype(np.float64).copy(), ref[k].astype(np.float64).copy()
                            if ("grad." + k) in grads.files:
                                noise = np.abs(grads["grad." + k]) <= 1e-6 * top
                                if np.any(np.abs(g[noise] - w[noise]) > 2.1 * o["lr"] * steps):
                                    worst = float("inf")
                                g[noise] = 0.0
                                w[noise] = 0.0
                            worst = max(worst, float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)))
                        r["param_rel_l2"] = worst
                        ok &= worst <= 2e-2
                    r["ok"] = bool(ok)
            except Exception as e:  # noqa: BLE001 - recorded, the next model runs
                r.update(ok=False, error=repr(e)[-400:])
            r["seconds"] = round(time.time() - t0, 1)
            rows.append(r)
            print(json.dumps(r, default=plain), flush=True)
    return rows


def timing(graphc, scratch, timeout, small, skip_torch=False):
    import torch
    import torch.nn.functional as F
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from train_refs import Logits  # noqa: E402

    layers, d, heads, batch, seq = (2, 64, 4, 2, 32) if small else (12, 768, 12, 4, 512)
    vocab = 128 if small else 50257
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=d, n_layer=layers, n_head=heads,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                                  attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Logits(transformers.GPT2LMHeadModel(cfg), use_cache=False)
    x = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    onnx_path = scratch / "gpt2_train.onnx"
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (), kwargs={"input_ids": x}, f=str(onnx_path), dynamo=True, optimize=False,
                          input_names=["input_ids"], output_names=["logits"], external_data=True)
    np.savez(scratch / "gpt2_train_inputs.npz", input_ids=x.numpy(), labels=x.numpy())
    res = {"shape": dict(layers=layers, d=d, heads=heads, batch=batch, seq=seq, vocab=vocab), "device": dev}

    def step_fn(m, opt):
        def step():
            opt.zero_grad(set_to_none=True)
            logits = m(input_ids=xd)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), xd[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return loss
        return step

    def median_ms(fn, warm=3, iters=10):
        for _ in range(warm):
            fn()
        ts = []
        for _ in range(iters):
            if dev == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                ts.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(ts))

    def autocast_step(m, opt):
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = m(input_ids=xd)
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, vocab), xd[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return loss
        return step

    xd = x.to(dev)
    for mode in [] if skip_torch else ["eager", "compile", "bf16_eager", "bf16_compile", "bf16_ckpt_eager"]:
        try:
            m = Logits(transformers.GPT2LMHeadModel(cfg), use_cache=False).to(dev)
            m.load_state_dict(model.state_dict())
            m.train()
            if "ckpt" in mode:
                # Gradient checkpointing, as `--remat full` does it.
                m.m.gradient_checkpointing_enable()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
            fn = autocast_step(m, opt) if mode.startswith("bf16") else step_fn(m, opt)
            if mode.endswith("compile"):
                fn = torch.compile(fn)
            if dev == "cuda":
                torch.cuda.reset_peak_memory_stats()
            res[f"torch_{mode}_ms"] = median_ms(fn)
            if dev == "cuda":
                res[f"torch_{mode}_peak_bytes"] = torch.cuda.max_memory_allocated()
        except Exception as e:  # noqa: BLE001
            res[f"torch_{mode}_error"] = repr(e)[-400:]
        del m
    for prec, key, remat in [("fp32", "graphc", "off"), ("bf16", "graphc_bf16", "off"),
                             ("bf16", "graphc_bf16_full", "full")]:
        step = ["--loss", "cross-entropy", "--target", "labels", "--shift-labels", "--optimizer", "adamw",
                "--lr", "1e-4", "--precision", prec, "--remat", remat]
        measured = scratch / f"{key}_per_kernel.json"
        args = [graphc, "train", str(onnx_path), "--inputs", str(scratch / "gpt2_train_inputs.npz"), *step,
                "--steps", "6", "--device", "cuda" if dev == "cuda" else "cpu"]
        if dev == "cuda":
            args += ["--per-kernel", "--per-kernel-json", str(measured)]
        try:
            p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
            res[f"{key}_stdout"] = p.stdout[-6000:]
            for line in p.stdout.splitlines():
                if line.startswith("time ") and "median step" in line:
                    res[f"{key}_ms"] = float(line.split("median step")[1].split()[0])
            if p.returncode != 0:
                res[f"{key}_error"] = (p.stderr or p.stdout)[-400:]
        except Exception as e:  # noqa: BLE001
            res[f"{key}_error"] = repr(e)[-400:]
        # The performance model's prediction of the same step on this GPU, beside it.
        if dev == "cuda" and key != "graphc_bf16_full" and measured.exists():
            try:
                res[f"{key}_model"] = model_vs_measured(graphc, onnx_path, step, measured, timeout)
            except Exception as e:  # noqa: BLE001
                res[f"{key}_model"] = {"error": repr(e)[-400:]}
    plan = subprocess.run([graphc, "plan", str(onnx_path), "--train", "--loss", "cross-entropy", "--shift-labels",
                           "--optimizer", "adamw", "--json"], capture_output=True, text=True, timeout=timeout)
    try:
        res["graphc_plan_total_bytes"] = json.loads(plan.stdout)["train"]["total"]
    except Exception:  # noqa: BLE001
        res["graphc_plan_error"] = plan.stderr[-400:]
    return res


def gpu_name():
    """The performance model's name for this GPU (`graphc plan --time --gpu`), or None."""
    import torch
    name = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() else ""
    return "h200" if "h200" in name else ("rtx4090d" if "4090" in name else None)


def spearman(xs, ys):
    """Spearman's rank correlation (ties by mean rank)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def model_vs_measured(graphc, onnx_path, step, measured, timeout):
    """`graphc plan --time --json` of the step `train --per-kernel-json` measured, on this
    GPU, joined by kernel (plan step): the model's error by kind (median and geometric
    mean of modeled / measured) and its rank correlation."""
    res = {}
    gpu = gpu_name()
    if gpu is None:
        return {**res, "error": "the performance model knows no GPU of this name"}
    plan = subprocess.run([graphc, "plan", str(onnx_path), "--train", *step, "--time", "--gpu", gpu, "--json"],
                          capture_output=True, text=True, timeout=timeout)
    try:
        model = json.loads(plan.stdout)["time"]
        launches = json.loads(measured.read_text())
    except Exception:  # noqa: BLE001
        return {**res, "error": "plan --time: " + plan.stderr[-400:]}
    by_step = {}
    for lt in launches:
        by_step[lt["step"]] = by_step.get(lt["step"], 0.0) + lt["median_ms"] * 1e-3
    rows = [(k["kind"], k["modeled_s"], by_step[i]) for i, k in enumerate(model["kernels"]) if i in by_step]
    kinds = {}
    for kind, m, t in rows:
        kinds.setdefault(kind, []).append(m / t if t > 0 else float("nan"))
    summary = {}
    for kind, r in kinds.items():
        r = sorted(x for x in r if x == x and x > 0)
        if r:
            summary[kind] = {"kernels": len(r), "median_ratio": r[len(r) // 2],
                             "geomean_ratio": math.exp(sum(math.log(x) for x in r) / len(r))}
    return {**res, "gpu": gpu, "modeled_ms": model["modeled_s"] * 1e3, "ideal_ms": model["ideal_s"] * 1e3,
            "measured_sum_ms": sum(t for _, _, t in rows) * 1e3,
            "spearman": spearman([m for _, m, _ in rows], [t for _, _, t in rows]), "by_kind": summary}


def model_md(key, r):
    if "error" in r:
        return ["", f"{key}: performance model against --per-kernel: {r['error']}"]
    md = ["", f"{key}: performance model ({r['gpu']}) against --per-kernel: modeled {r['modeled_ms']:.2f} ms, "
              f"measured launches {r['measured_sum_ms']:.2f} ms (one by one), ideal {r['ideal_ms']:.2f} ms; "
              f"Spearman rank correlation over kernels {r['spearman']:.3f}", "",
          "| kind | kernels | modeled / measured, median | geometric mean |", "|---|---|---|---|"]
    for kind, v in sorted(r["by_kind"].items()):
        md.append(f"| {kind} | {v['kernels']} | {v['median_ratio']:.2f} | {v['geomean_ratio']:.2f} |")
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphc", default="target/release/graphc")
    ap.add_argument("--out", default="target/gpu-check")
    ap.add_argument("--scratch", default="/tmp/gpu_check/train")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--small", action="store_true", help="tiny timing model, torch on the CPU if no GPU")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--skip-torch", action="store_true", help="time graphc's steps only (with --per-kernel on a GPU)")
    a = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    out, scratch = Path(a.out), Path(a.scratch)
    out.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    rows = [] if a.skip_correctness else correctness(root, a.graphc, scratch, a.timeout)
    rows += [] if a.skip_correctness else amp_rows(root, a.graphc, scratch, a.timeout)
    result = {"correctness": rows}
    (out / "train_check.json").write_text(json.dumps(result, indent=1, default=plain))
    try:
        result["timing"] = timing(a.graphc, scratch, a.timeout * 3, a.small, a.skip_torch)
    except Exception as e:  # noqa: BLE001 - e.g. no transformers on the machine
        result["timing"] = {"error": repr(e)[-400:]}
    (out / "train_check.json").write_text(json.dumps(result, indent=1, default=plain))
    md = ["| model | optimizer | result | loss rel | params rel L2 |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['model']} | {r['optimizer']} | {'ok' if r.get('ok') else 'FAIL'} | "
                  f"{r.get('loss_rel', '-')} | {r.get('param_rel_l2', r.get('error', '-'))} |")
    t = result["timing"]
    md += ["", f"training step {t.get('shape')} on {t.get('device')}{(': ' + t['error']) if 'error' in t else ''}:", "",
           "| graphc (wall, median) | torch eager | torch.compile | graphc plan total | torch eager peak |",
           "|---|---|---|---|---|",
           f"| {t.get('graphc_ms', t.get('graphc_error', '-'))} ms | {t.get('torch_eager_ms', '-')} ms | "
           f"{t.get('torch_compile_ms', t.get('torch_compile_error', '-'))} ms | {t.get('graphc_plan_total_bytes', '-')} | "
           f"{t.get('torch_eager_peak_bytes', '-')} |",
           "", "bf16 (graphc --precision bf16; PyTorch autocast bf16, f32 master weights):", "",
           "| graphc bf16 (wall, median) | torch eager + autocast | torch.compile + autocast | torch eager peak |",
           "|---|---|---|---|",
           f"| {t.get('graphc_bf16_ms', t.get('graphc_bf16_error', '-'))} ms | {t.get('torch_bf16_eager_ms', '-')} ms | "
           f"{t.get('torch_bf16_compile_ms', t.get('torch_bf16_compile_error', '-'))} ms | "
           f"{t.get('torch_bf16_eager_peak_bytes', '-')} |",
           "", "bf16 with recomputation (graphc --remat full; PyTorch gradient_checkpointing_enable()):", "",
           "| graphc bf16 --remat full (wall, median) | torch eager + autocast + checkpointing | torch peak |",
           "|---|---|---|",
           f"| {t.get('graphc_bf16_full_ms', t.get('graphc_bf16_full_error', '-'))} ms | "
           f"{t.get('torch_bf16_ckpt_eager_ms', t.get('torch_bf16_ckpt_eager_error', '-'))} ms | "
           f"{t.get('torch_bf16_ckpt_eager_peak_bytes', '-')} |"]
    # On a GPU: where graphc's step time goes (`graphc train --per-kernel`), and the
    # performance model's prediction of the same kernels.
    for key in ["graphc", "graphc_bf16"]:
        if f"{key}_model" in t:
            md += model_md(key, t[f"{key}_model"])
    for key in ["graphc", "graphc_bf16", "graphc_bf16_full"]:
        text = t.get(f"{key}_stdout", "")
        if "per launch" in text:
            md += ["", f"{key}: per launch", "", "```", text[text.index("per launch"):].rstrip(), "```"]
    (out / "train_check.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
