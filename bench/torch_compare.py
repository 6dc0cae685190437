#!/usr/bin/env python3
"""graphc against PyTorch eager and torch.compile, on the same weights and inputs, in one run.

For each benchmark model: define it in PyTorch, make weights and inputs once (fixed seeds),
run it eagerly once (the reference output), measure torch's peak memory around one eager
forward, export it to ONNX (TorchScript exporter, falling back to the dynamo exporter),
save the inputs to .npz under the ONNX input names, run `graphc run` (its output against
torch eager: relative L2) and `graphc bench --json`, then time torch eager and
torch.compile (default mode) with CUDA events (median over the iterations, after warm-up,
under torch.inference_mode()).

Writes (into $OUT, or ./target/gpu-check when OUT is unset; --out to change):
  torch_compare.json   every raw number, rewritten after every step
  torch_compare.md     the markdown table, rewritten after every model
  torch_compare_logs/  stdout/stderr of every graphc command
ONNX files and .npz inputs go to a scratch folder (--scratch, default /tmp/gpu_check/torch),
never to $OUT.

  python3 bench/torch_compare.py            full sizes, on CUDA (the GPU check)
  python3 bench/torch_compare.py --small    tiny sizes; on CPU when there is no CUDA

Dependencies: torch, numpy, onnx (the exporter needs it; onnxscript only for the dynamo
fallback).
"""

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MiB = 1 << 20
GiB = 1 << 30

# ----------------------------------------------------------------------------- models


class GeluSigmoid(nn.Module):
    """(a) y = gelu_erf(x * 1.5 + 0.25) * sigmoid(x)."""

    def forward(self, x):
        return F.gelu(x * 1.5 + 0.25) * torch.sigmoid(x)


class LayerNormGelu(nn.Module):
    """(b) y = gelu_erf(layer_norm(x)) with affine weight and bias."""

    def __init__(self, cols):
        super().__init__()
        self.cols = cols
        self.weight = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return F.gelu(F.layer_norm(x, (self.cols,), self.weight, self.bias, 1e-5))


class Softmax(nn.Module):
    """(c) softmax over the last axis."""

    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Mlp(nn.Module):
    """Linear -> tanh GELU -> Linear (the GEMM epilogue form)."""

    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Linear(nn.Module):
    """One bias-free linear layer: graphc's weight-only quantized GEMM against torch's bf16 GEMM."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x):
        return self.fc(x)


class Block(nn.Module):
    """A pre-LN transformer block; attention written plainly, or with SDPA when `gpt.sdpa`."""

    def __init__(self, d, heads):
        super().__init__()
        self.d = d
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, mask, sdpa):
        b, s, d = x.shape
        h, dh = self.heads, self.d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(self.d, dim=-1)
        q = q.reshape(b, s, h, dh).transpose(1, 2)
        k = k.reshape(b, s, h, dh).transpose(1, 2)
        v = v.reshape(b, s, h, dh).transpose(1, 2)
        if sdpa:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
            att = att.masked_fill(mask, float("-inf"))
            att = torch.softmax(att, dim=-1)
            a = att @ v
        a = a.transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))
        return x


class Attention(nn.Module):
    """Causal attention of q, k, v [batch, heads, seq, dim] written plainly (graphc's
    e-graph recognizes it as one attention kernel); with SDPA when `sdpa`."""

    def __init__(self, seq):
        super().__init__()
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        self.sdpa = False

    def forward(self, q, k, v):
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(self.mask, float("-inf"))
        return torch.softmax(att, dim=-1) @ v


class Gpt(nn.Module):
    """Pre-LN blocks and a final LayerNorm; the input is the hidden states [batch, seq, d]."""

    def __init__(self, layers, d, heads, seq):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        # True above the diagonal: the positions a query may not see.
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        self.sdpa = False

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x, self.mask, self.sdpa)
        return self.ln_f(x)


# ----------------------------------------------------------------------------- specs

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def specs(small):
    """The benchmark models, cheap ones first."""
    if small:
        n, (lr, lc), (sr, sc) = 1 << 16, (64, 256), (64, 256)
        m, d, hid = 64, 128, 512
        lin = 256
        g = dict(layers=2, d=64, heads=4, batch=2, seq=32)
        kw, ki, bw, bi = 2, 5, 2, 5
        rb, rs = 2, 64
    else:
        n, (lr, lc), (sr, sc) = 64 << 20, (8192, 4096), (8192, 8192)
        m, d, hid = 8192, 4096, 16384
        lin = 4096
        g = dict(layers=12, d=1024, heads=16, batch=8, seq=1024)
        kw, ki, bw, bi = 10, 50, 5, 20
        rb, rs = 64, 224
    mlp_flops = 2 * m * d * hid * 2
    t = g["batch"] * g["seq"]
    gpt_flops = g["layers"] * (24 * t * g["d"] ** 2 + 4 * g["batch"] * g["seq"] ** 2 * g["d"])
    gpt_spec = dict(
        name="gpt",
        size="L{layers} d{d} h{heads} b{batch} s{seq}".format(**g),
        dtype="bf16",
        make=lambda: Gpt(g["layers"], g["d"], g["heads"], g["seq"]),
        input_shapes=[(g["batch"], g["seq"], g["d"])],
        metric="TFLOP/s",
        flops=gpt_flops,
        sdpa=True,
        per_kernel=True,
        warmup=bw,
        iters=bi,
        graphc_timeout_scale=1.5,
    )
    return [
        dict(
            name="gelu_sigmoid",
            size=f"{n >> 20}M" if n >= MiB else str(n),
            dtype="f32",
            make=lambda: GeluSigmoid(),
            input_shapes=[(n,)],
            metric="GB/s",
            warmup=kw,
            iters=ki,
        ),
        dict(
            name="layernorm_gelu",
            size=f"{lr}x{lc}",
            dtype="bf16",
            make=lambda: LayerNormGelu(lc),
            input_shapes=[(lr, lc)],
            metric="GB/s",
            warmup=kw,
            iters=ki,
        ),
        dict(
            name="softmax",
            size=f"{sr}x{sc}",
            dtype="f32",
            make=lambda: Softmax(),
            input_shapes=[(sr, sc)],
            metric="GB/s",
            warmup=kw,
            iters=ki,
        ),
        dict(
            name="mlp",
            size=f"{m}x{d}->{hid}->{d}",
            dtype="f32",
            tf32=True,
            make=lambda: Mlp(d, hid),
            input_shapes=[(m, d)],
            metric="TFLOP/s",
            flops=mlp_flops,
            warmup=bw,
            iters=bi + 10,
        ),
        dict(
            name="mlp",
            size=f"{m}x{d}->{hid}->{d}",
            dtype="bf16",
            make=lambda: Mlp(d, hid),
            input_shapes=[(m, d)],
            metric="TFLOP/s",
            flops=mlp_flops,
            warmup=bw,
            iters=bi + 10,
        ),
        # The attention kernel alone, causal bf16 at seq 1024, head dims 64 and 128
        # (flops of the causal half: 2 * 2 * b * h * s^2 * d / 2); the target is 50% of
        # the device's dense bf16 tensor-core peak.
        *[
            dict(
                name="attention",
                size=f"b{ab} h{ah} s{aseq} d{ad}",
                dtype="bf16",
                make=(lambda s_=aseq: Attention(s_)),
                input_shapes=[(ab, ah, aseq, ad)] * 3,
                metric="TFLOP/s",
                flops=2 * ab * ah * aseq * aseq * ad,
                sdpa=True,
                warmup=bw,
                iters=bi,
            )
            for (ab, ah, aseq, ad) in ([(2, 2, 64, 64)] if small else [(8, 16, 1024, 64), (8, 8, 1024, 128)])
        ],
        gpt_spec,
        # The same GPT exported with F.scaled_dot_product_attention (`export_sdpa`): the
        # form users export; graphc must find the same attention kernels in it. Through
        # torch.onnx.export's default exporter since torch 2.9 (the TorchScript exporter
        # writes an invalid model for bf16 SDPA: a LayerNormalization of f32 input and
        # bf16 scale, which onnx.checker rejects).
        dict(gpt_spec, name="gpt_sdpa_export", export_sdpa=True, exporter="dynamo", per_kernel=False),
        # A decode-sized linear layer (batch 1-16 tokens, 4096 x 4096): graphc's int4 and int8
        # weight-only GEMMs (`--weights`, a generated tensor-core kernel) against torch's
        # bf16 GEMM (cuBLAS) and graphc's own bf16 GEMM (cuBLASLt); the int4 target is to beat
        # the bf16 GEMM (it moves a quarter of the weight bytes). Outputs differ by the
        # quantization error (relative L2 ~0.1 at int4 for random weights).
        *[
            dict(
                name="linear",
                size=f"{tok}x{lin}->{lin}",
                dtype="bf16",
                weights=wq,
                make=(lambda: Linear(lin, lin)),
                input_shapes=[(tok, lin)],
                metric="GB/s",
                warmup=kw,
                iters=ki,
            )
            for tok in ((1,) if small else (1, 16))
            for wq in (None, "int8", "int4")
        ],
        # ResNet-50 inference in bf16 (torchvision, random weights, eval mode: the exporter
        # folds BatchNorm into the convolutions), PyTorch in channels-last as
        # torch.compile users run CNNs. ~4.1 GMACs per 224x224 image.
        dict(
            name="resnet50",
            size=f"b{rb} {rs}x{rs}",
            dtype="bf16",
            make=lambda: __import__("torchvision").models.resnet50(weights=None),
            input_shapes=[(rb, 3, rs, rs)],
            metric="TFLOP/s",
            flops=2 * 4.09e9 * rb * (rs / 224) ** 2,
            channels_last=True,
            exporter="dynamo",
            warmup=bw,
            iters=bi,
        ),
        # Mixed precision (graphc --precision, torch.autocast) of the f32 MLP, last: the
        # GPT matters more if time runs short.
        *[
            dict(
                name="mlp",
                size=f"{m}x{d}->{hid}->{d}",
                dtype="f32",
                precision=p,
                make=lambda: Mlp(d, hid),
                input_shapes=[(m, d)],
                metric="TFLOP/s",
                flops=mlp_flops,
                warmup=bw,
                iters=bi + 10,
            )
            for p in ("bf16", "fp16")
        ],
    ]


# ----------------------------------------------------------------------------- helpers


def spec_key(spec):
    """`mlp_bf16`, or `mlp_f32_as_bf16` for an f32 model run in mixed precision."""
    key = f"{spec['name']}_{spec['dtype']}"
    key += f"_as_{spec['precision']}" if spec.get("precision") else ""
    return key + (f"_{spec['weights']}_weights" if spec.get("weights") else "")


def autocast(spec, dev):
    """torch.autocast to the spec's precision (graphc's --precision), else nothing."""
    p = spec.get("precision")
    if not p:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(dev).type, dtype=DTYPES[{"fp16": "f16"}.get(p, p)])


class Timer:
    """Median of per-iteration timings: CUDA events on CUDA, perf_counter on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, warmup, iters):
        for _ in range(warmup):
            fn()
        self.sync()
        ts = []
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
            for s, e in ev:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            ts = [s.elapsed_time(e) for s, e in ev]
        else:
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
        return {
            "median_ms": statistics.median(ts),
            "min_ms": min(ts),
            "max_ms": max(ts),
            "warmup": warmup,
            "iters": iters,
        }


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        return None
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    if not np.isfinite(num):
        return float("inf")
    return float(num / den) if den > 0 else float(num)


def to_numpy(t):
    """A tensor as numpy; bf16 travels as float32 (exactly), as graphc's .npz does."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def tail(text, n=1500):
    text = (text or "").strip()
    return text[-n:]


def one_line(text, n=300):
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    s = " / ".join(lines[-3:]) if lines else ""
    s = s.replace("|", "\\|")
    return s[-n:]


def parse_json_stdout(stdout):
    s = (stdout or "").strip()
    try:
        return json.loads(s)
    except ValueError:
        pass
    # The object is the last thing printed: try each line start that opens one.
    starts = [m.start() for m in re.finditer(r"(?m)^\{", s)]
    for i in reversed(starts):
        try:
            return json.loads(s[i:])
        except ValueError:
            continue
    return None


def export_onnx(model, args, path, input_names, output_names, log, exporter="auto"):
    """TorchScript exporter first (opset 17), the dynamo exporter if that raises."""
    errors = []
    order = {"auto": (False, True), "torchscript": (False,), "dynamo": (True,)}[exporter]
    for dynamo in order:
        kw = dict(input_names=input_names, output_names=output_names, dynamo=dynamo)
        kw["opset_version"] = 17 if not dynamo else 18
        if dynamo:
            kw["external_data"] = True
        try:
            for f in os.listdir(os.path.dirname(path)):
                if f.startswith(os.path.basename(path)):
                    os.remove(os.path.join(os.path.dirname(path), f))
            t0 = time.perf_counter()
            with torch.no_grad(), warnings.catch_warnings():
                # The TorchScript exporter's deprecation notice, on every call.
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                res = torch.onnx.export(model, args, path, **kw)
            if dynamo and res is not None and not os.path.exists(path):
                res.save(path, external_data=True)
            return {
                "exporter": "dynamo" if dynamo else "torchscript",
                "export_s": time.perf_counter() - t0,
                "errors": errors,
            }
        except Exception as e:  # noqa: BLE001 - any exporter failure: record and try the next
            msg = f"{'dynamo' if dynamo else 'torchscript'} exporter: {type(e).__name__}: {e}"
            log(f"  export failed: {msg[:500]}")
            errors.append(msg[-3000:])
    raise RuntimeError("ONNX export failed: " + " || ".join(m[-600:] for m in errors))


def onnx_op_types(path):
    try:
        import onnx

        m = onnx.load(path, load_external_data=False)
        ops = {}
        for node in m.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        return {"opset": [(o.domain, o.version) for o in m.opset_import], "ops": ops}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


# ----------------------------------------------------------------------------- driver


class Runner:
    def __init__(self, a):
        self.a = a
        self.t_start = time.perf_counter()
        self.device = torch.device("cuda" if torch.cuda.is_available() and not a.cpu else "cpu")
        self.cuda = self.device.type == "cuda"
        self.timer = Timer(self.device)
        self.out = a.out
        self.logs = os.path.join(self.out, "torch_compare_logs")
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(a.scratch, exist_ok=True)
        self.results = {
            "meta": self.meta(),
            "copy_baseline": None,
            "models": [],
        }

    def log(self, msg):
        print(f"[{time.perf_counter() - self.t_start:7.1f}s] {msg}", flush=True)

    def meta(self):
        m = {
            "small": self.a.small,
            "device": self.device.type,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": sys.version.split()[0],
            "graphc": self.a.graphc,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        try:
            import onnx

            m["onnx"] = onnx.__version__
        except Exception:  # noqa: BLE001
            m["onnx"] = None
        try:
            import onnxscript

            m["onnxscript"] = onnxscript.__version__
        except Exception:  # noqa: BLE001
            m["onnxscript"] = None
        if self.device.type == "cuda":
            p = torch.cuda.get_device_properties(0)
            m["gpu"] = p.name
            m["capability"] = f"sm_{p.major}{p.minor}"
            m["gpu_memory_bytes"] = p.total_memory
            m["cuda"] = torch.version.cuda
        return m

    def save(self):
        path = os.path.join(self.out, "torch_compare.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        os.replace(tmp, path)
        with open(os.path.join(self.out, "torch_compare.md"), "w") as f:
            f.write(self.markdown())

    def graphc(self, label, args, timeout):
        """Run graphc; keep its output in torch_compare_logs/LABEL.txt."""
        cmd = [self.a.graphc] + args
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            se = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + (
                f"\n(timed out after {timeout} s)"
            )
        except OSError as e:
            rc, so, se = "oserror", "", str(e)
        wall = time.perf_counter() - t0
        with open(os.path.join(self.logs, label + ".txt"), "w") as f:
            f.write(f"$ {' '.join(cmd)}\n# rc={rc} wall={wall:.1f}s\n--- stdout\n{so}\n--- stderr\n{se}\n")
        self.log(f"  graphc {label.split('.', 1)[-1]}: rc={rc} in {wall:.1f}s")
        return rc, so, se, wall

    def free(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    # --------------------------------------------------------------- copy baseline

    def copy_baseline(self):
        nbytes = (1 * GiB) if not self.a.small else (16 * MiB)
        rec = {"bytes": nbytes}
        self.results["copy_baseline"] = rec
        try:
            x = torch.empty(nbytes // 4, dtype=torch.float32, device=self.device).normal_()
            y = torch.empty_like(x)
            t = self.timer.time(lambda: y.copy_(x), 5, 50 if not self.a.small else 10)
            rec.update(t)
            rec["GB/s"] = 2 * nbytes / (t["median_ms"] * 1e-3) / 1e9
            self.log(f"copy baseline: {nbytes >> 20} MiB in {t['median_ms']:.3f} ms = {rec['GB/s']:.0f} GB/s")
            del x, y
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {e}"
            self.log(f"copy baseline failed: {rec['error']}")
        self.free()
        self.save()

    # --------------------------------------------------------------- one model

    def run_model(self, spec):
        a = self.a
        dev = self.device
        dtype = DTYPES[spec["dtype"]]
        key = spec_key(spec)
        rec = {
            "model": spec["name"],
            "size": spec["size"],
            "dtype": spec["dtype"],
            "tf32": bool(spec.get("tf32")),
            "precision": spec.get("precision"),
            "weights": spec.get("weights"),
            "metric": spec["metric"],
            "flops": spec.get("flops"),
            "errors": [],
        }
        self.results["models"].append(rec)
        self.log(f"=== {key} ({spec['size']})")
        if a.deadline and time.perf_counter() - self.t_start > a.deadline:
            rec["errors"].append(f"skipped: past the deadline of {a.deadline} s")
            self.log("  skipped (deadline)")
            self.save()
            return
        warmup, iters = spec["warmup"], spec["iters"]
        if a.small:
            warmup, iters = 2, 5
        tmo = a.graphc_timeout * spec.get("graphc_timeout_scale", 1.0)
        tf32 = bool(spec.get("tf32")) and self.cuda
        prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
        try:
            if tf32:
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.set_float32_matmul_precision("high")
            self._run_model(spec, rec, key, dev, dtype, warmup, iters, tmo, tf32)
        except Exception as e:  # noqa: BLE001 - record, keep going
            rec["errors"].append(f"{type(e).__name__}: {e}"[-2000:])
            rec["traceback"] = traceback.format_exc()[-4000:]
            self.log(f"  FAILED: {type(e).__name__}: {str(e)[:400]}")
        finally:
            try:
                torch.backends.cuda.matmul.allow_tf32 = prev_tf32[0]
                torch.set_float32_matmul_precision(prev_tf32[1])
                self.free()
            except Exception as e:  # noqa: BLE001
                rec["errors"].append(f"cleanup: {type(e).__name__}: {e}")
            self.save()

    def _run_model(self, spec, rec, key, dev, dtype, warmup, iters, tmo, tf32):
        a = self.a
        self.graphc_extra = ["--precision", spec["precision"]] if spec.get("precision") else []
        if spec.get("weights"):
            self.graphc_extra += ["--weights", spec["weights"]]
        torch.manual_seed(1234)
        model = spec["make"]().to(device=dev, dtype=dtype).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        gen = torch.Generator().manual_seed(42)
        inputs = [
            torch.randn(s, generator=gen, dtype=torch.float32).to(device=dev, dtype=dtype) for s in spec["input_shapes"]
        ]
        if spec.get("channels_last"):
            # PyTorch's runs in channels-last (the export and graphc see the same values).
            model = model.to(memory_format=torch.channels_last)
            inputs = [t.contiguous(memory_format=torch.channels_last) for t in inputs]
        input_names = ["x"] if len(inputs) == 1 else [f"x{i}" for i in range(len(inputs))]
        rec["input_names"] = input_names
        rec["weights_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        rec["inputs_bytes"] = sum(t.numel() * t.element_size() for t in inputs)

        # The reference output: one eager forward (also warms cuBLAS up).
        with torch.inference_mode():
            y = model(*inputs)
            self.timer.sync()
        ref = to_numpy(y)
        rec["outputs_bytes"] = y.numel() * y.element_size()
        rec["output_shape"] = list(y.shape)
        del y
        moved = rec["inputs_bytes"] + rec["outputs_bytes"] + rec["weights_bytes"]
        rec["bytes_moved"] = moved

        # torch's memory: weights and inputs on the device, peak around one eager forward.
        if self.cuda:
            with autocast(spec, dev):
                rec["torch_peak_bytes"], rec["torch_base_bytes"] = self.peak_memory(model, inputs)
            self.log(f"  torch peak {rec['torch_peak_bytes'] / MiB:.1f} MiB (base {rec['torch_base_bytes'] / MiB:.1f})")
        self.save()

        # Export + inputs for graphc.
        d = os.path.join(a.scratch, key)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        onnx_path = os.path.join(d, "model.onnx")
        in_path = os.path.join(d, "inputs.npz")
        out_path = os.path.join(d, "outputs.npz")
        np.savez(in_path, **{n: to_numpy(t) for n, t in zip(input_names, inputs)})
        graphc_ok = True
        try:
            self.log("  export")
            # `export_sdpa`: graphc gets the model as users export it with
            # F.scaled_dot_product_attention (the form transformers uses by default).
            if spec.get("export_sdpa"):
                model.sdpa = True
            try:
                rec["export"] = export_onnx(
                    model, tuple(inputs), onnx_path, input_names, ["y"], self.log, spec.get("exporter", a.exporter)
                )
            finally:
                model.sdpa = False
            rec["export"]["onnx_bytes"] = sum(
                os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.startswith("model.onnx")
            )
            rec["export"]["onnx"] = onnx_op_types(onnx_path)
            self.log(
                f"  exported with {rec['export']['exporter']} in {rec['export']['export_s']:.1f}s: "
                f"ops {rec['export']['onnx'].get('ops')}"
            )
        except Exception as e:  # noqa: BLE001
            rec["errors"].append(f"export: {e}"[-2000:])
            graphc_ok = False
        self.save()

        if graphc_ok:
            self.free()
            self.run_graphc(rec, key, onnx_path, in_path, out_path, ref, warmup, iters, tmo, tf32)
            self.save()
            if spec.get("per_kernel") and not a.no_per_kernel and "graphc_bench" in rec:
                self.run_per_kernel(rec, key, onnx_path, in_path, tmo, tf32)
                self.save()

        # torch eager.
        with torch.inference_mode(), autocast(spec, dev):
            rec["eager"] = self.timer.time(lambda: model(*inputs), warmup, iters)
        self.log(f"  eager {rec['eager']['median_ms']:.3f} ms")
        self.save()

        # torch.compile (default mode).
        if not a.skip_compile:
            try:
                torch._dynamo.reset()
                cm = torch.compile(model)
                t0 = time.perf_counter()
                with torch.inference_mode(), autocast(spec, dev):
                    yc = cm(*inputs)
                    self.timer.sync()
                compile_s = time.perf_counter() - t0
                rec["compile_rel_l2_vs_eager"] = rel_l2(to_numpy(yc), ref)
                del yc
                with torch.inference_mode(), autocast(spec, dev):
                    rec["compile"] = self.timer.time(lambda: cm(*inputs), warmup, iters)
                rec["compile"]["compile_s"] = compile_s
                if self.cuda:
                    with autocast(spec, dev):
                        rec["compile"]["peak_bytes"], _ = self.peak_memory(cm, inputs)
                self.log(f"  compile {rec['compile']['median_ms']:.3f} ms (compiled in {compile_s:.1f}s)")
                del cm
            except Exception as e:  # noqa: BLE001
                rec["errors"].append(f"torch.compile: {type(e).__name__}: {e}"[-1500:])
                self.log(f"  torch.compile failed: {type(e).__name__}: {str(e)[:300]}")
            self.save()

        # The SDPA reference (same weights).
        if spec.get("sdpa"):
            try:
                model.sdpa = True
                with torch.inference_mode():
                    ys = model(*inputs)
                    self.timer.sync()
                rec["sdpa_rel_l2_vs_eager"] = rel_l2(to_numpy(ys), ref)
                del ys
                with torch.inference_mode():
                    rec["sdpa"] = self.timer.time(lambda: model(*inputs), warmup, iters)
                if self.cuda:
                    rec["sdpa"]["peak_bytes"], _ = self.peak_memory(model, inputs)
                self.log(f"  eager+SDPA {rec['sdpa']['median_ms']:.3f} ms")
                # torch.compile of the SDPA model: the baseline graphc's GPT must beat.
                if not a.skip_compile:
                    torch._dynamo.reset()
                    cs = torch.compile(model)
                    t0 = time.perf_counter()
                    with torch.inference_mode():
                        cs(*inputs)
                        self.timer.sync()
                    compile_s = time.perf_counter() - t0
                    with torch.inference_mode():
                        rec["compile_sdpa"] = self.timer.time(lambda: cs(*inputs), warmup, iters)
                    rec["compile_sdpa"]["compile_s"] = compile_s
                    self.log(f"  compile+SDPA {rec['compile_sdpa']['median_ms']:.3f} ms")
                    del cs
            except Exception as e:  # noqa: BLE001
                rec["errors"].append(f"SDPA: {type(e).__name__}: {e}"[-1500:])
            finally:
                model.sdpa = False
        del model, inputs

    def peak_memory(self, model, inputs):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            y = model(*inputs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del y
        return peak, base

    def run_graphc(self, rec, key, onnx_path, in_path, out_path, ref, warmup, iters, tmo, tf32):
        dev = "cuda" if self.cuda else "cpu"
        extra = (["--tf32"] if tf32 else []) + self.graphc_extra
        # One run to compare outputs.
        rc, so, se, wall = self.graphc(
            f"{key}.run",
            ["run", onnx_path, "--device", dev, "--inputs", in_path, "--output", out_path] + extra,
            tmo,
        )
        rec["graphc_run"] = {"rc": rc, "wall_s": wall}
        if rc == 0 and os.path.exists(out_path):
            try:
                with np.load(out_path) as z:
                    names = list(z.keys())
                    out = z["y"] if "y" in z else z[names[0]]
                    rec["graphc_rel_l2"] = rel_l2(out, ref)
                    if out.size != ref.size:
                        rec["errors"].append(f"graphc output shape {list(out.shape)} vs torch {list(ref.shape)}")
                self.log(f"  graphc vs torch eager: rel L2 {rec['graphc_rel_l2']}")
            except Exception as e:  # noqa: BLE001
                rec["errors"].append(f"reading graphc output: {type(e).__name__}: {e}")
        else:
            rec["graphc_run"]["stderr_tail"] = tail(se)
            rec["errors"].append(f"graphc run rc={rc}: {one_line(se or so)}")
            lu = ("", "", "", 0)
            if rc != "timeout":
                lu = self.graphc(f"{key}.unsupported", ["ir", onnx_path, "--list-unsupported"], min(tmo, 120))
            rec["graphc_list_unsupported"] = tail(lu[1] + "\n" + lu[2], 3000)
            if rc == "timeout":
                rec["errors"].append("graphc bench skipped: graphc run timed out")
                return
        # The timing.
        rc, so, se, wall = self.graphc(
            f"{key}.bench",
            ["bench", onnx_path, "--device", dev, "--inputs", in_path, "--json"]
            + ["--warmup", str(warmup), "--iters", str(iters)]
            + extra,
            tmo,
        )
        if rc == 0:
            j = parse_json_stdout(so)
            if j is None:
                rec["errors"].append("graphc bench: no JSON object on stdout")
            else:
                rec["graphc_bench"] = j
                self.log(
                    f"  graphc {j.get('median_ms')} ms, {j.get('kernels')} kernels, {j.get('launches')} launches, "
                    f"plan {(j.get('plan') or {}).get('total_bytes', 0) / MiB:.1f} MiB"
                )
        else:
            rec["graphc_bench_error"] = {"rc": rc, "stderr_tail": tail(se or so)}
            rec["errors"].append(f"graphc bench rc={rc}: {one_line(se or so)}")

    def run_per_kernel(self, rec, key, onnx_path, in_path, tmo, tf32):
        """graphc bench --per-kernel: where graphc's time goes (a few iterations)."""
        dev = "cuda" if self.cuda else "cpu"
        args = ["bench", onnx_path, "--device", dev, "--inputs", in_path, "--json", "--per-kernel"]
        args += ["--warmup", "2", "--iters", "5"] + (["--tf32"] if tf32 else []) + self.graphc_extra
        rc, so, se, _ = self.graphc(f"{key}.per_kernel", args, tmo)
        j = parse_json_stdout(so) if rc == 0 else None
        if j is None or not isinstance(j.get("per_kernel"), list):
            rec["graphc_per_kernel_error"] = f"rc={rc}: {one_line(se or so)}"
            return
        rec["graphc_per_kernel"] = {"median_ms": j.get("median_ms"), "per_kernel": j["per_kernel"]}

    # --------------------------------------------------------------- report

    def per_kernel_md(self):
        lines = []
        for rec in self.results["models"]:
            pk = rec.get("graphc_per_kernel")
            if not pk:
                continue
            ks = [k for k in pk["per_kernel"] if isinstance(k.get("median_ms"), (int, float))]
            total = sum(k["median_ms"] for k in ks)
            lines.append("")
            lines.append(
                f"graphc per kernel, {rec['model']} {rec['dtype']}: {len(ks)} steps, sum of medians "
                f"{total:.3f} ms (whole run {pk.get('median_ms')} ms)"
            )
            by_kind = {}
            for k in ks:
                c = by_kind.setdefault(k.get("kind", "?"), [0, 0.0])
                c[0] += 1
                c[1] += k["median_ms"]
            lines.append("")
            lines.append("| kind | steps | ms | share |")
            lines.append("|---|---|---|---|")
            for kind, (n, t) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
                lines.append(f"| {kind} | {n} | {t:.3f} | {100 * t / total if total else 0:.1f}% |")
            lines.append("")
            lines.append("| step | name | kind | ms |")
            lines.append("|---|---|---|---|")
            for k in sorted(ks, key=lambda k: -k["median_ms"])[:12]:
                lines.append(f"| {k.get('step')} | {k.get('name')} | {k.get('kind')} | {k['median_ms']:.3f} |")
        return lines

    def markdown(self):
        r = self.results
        m = r["meta"]
        lines = []
        lines.append(
            f"torch {m.get('torch')}, device {m.get('device')}"
            + (f" ({m.get('gpu')}, {m.get('capability')})" if m.get("gpu") else "")
            + (", --small sizes" if m.get("small") else "")
        )
        cb = r.get("copy_baseline") or {}
        if cb.get("GB/s"):
            lines.append(f"device copy baseline (y.copy_(x), {cb['bytes'] >> 20} MiB): {cb['GB/s']:.0f} GB/s")
        lines.append("")
        hdr = [
            "model",
            "dtype",
            "graphc ms",
            "eager ms",
            "compile ms",
            "speedup vs eager (eager/graphc)",
            "speedup vs compile (compile/graphc)",
            "graphc plan MiB",
            "torch peak MiB",
            "graphc vs torch rel L2",
            "GB/s or TFLOP/s",
            "problem",
        ]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))

        def ms(x):
            return f"{x:.3f}" if isinstance(x, (int, float)) else "n/a"

        def ratio(num, den):
            if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den > 0:
                return f"{num / den:.2f}x"
            return "n/a"

        for rec in r["models"]:
            gb = rec.get("graphc_bench") or {}
            g = gb.get("median_ms")
            e = (rec.get("eager") or {}).get("median_ms")
            c = (rec.get("compile") or {}).get("median_ms")
            plan = (gb.get("plan") or {}).get("total_bytes")
            peak = rec.get("torch_peak_bytes")
            rl = rec.get("graphc_rel_l2")
            name = f"{rec['model']} {rec.get('size', '')}".strip()
            dt = rec["dtype"] + (" (tf32)" if rec.get("tf32") else "")
            if rec.get("precision"):
                dt = f"{rec['dtype']} as {rec['precision']} (torch: autocast)"
            if rec.get("weights"):
                dt += f", graphc {rec['weights']} weights (torch bf16)"

            def metric(t):
                if not isinstance(t, (int, float)) or t <= 0:
                    return None
                if rec["metric"] == "GB/s":
                    return rec.get("bytes_moved", 0) / (t * 1e-3) / 1e9
                spec_flops = rec.get("flops")
                return spec_flops / (t * 1e-3) / 1e12 if spec_flops else None

            parts = []
            for lab, t in (("graphc", g), ("eager", e), ("compile", c)):
                v = metric(t)
                if v is not None:
                    parts.append(f"{lab} {v:.0f}" if v >= 100 else f"{lab} {v:.3g}")
            met = (", ".join(parts) + f" {rec['metric']}") if parts else "n/a"
            row = [
                name,
                dt,
                ms(g),
                ms(e),
                ms(c),
                ratio(e, g),
                ratio(c, g),
                f"{plan / MiB:.1f}" if isinstance(plan, (int, float)) else "n/a",
                f"{peak / MiB:.1f}" if isinstance(peak, (int, float)) else "n/a",
                f"{rl:.2e}" if isinstance(rl, (int, float)) else "n/a",
                met,
                "; ".join(one_line(err, 160) for err in rec.get("errors", [])[:2]),
            ]
            if g is None and rec.get("errors") and not m.get("small"):
                row[2] = "**failed**"
            lines.append("| " + " | ".join(row) + " |")
            if rec.get("sdpa"):
                s = rec["sdpa"]
                sp = s.get("peak_bytes")
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            name + " (torch SDPA)",
                            dt,
                            ms(g),
                            ms(s.get("median_ms")),
                            ms((rec.get("compile_sdpa") or {}).get("median_ms")),
                            ratio(s.get("median_ms"), g),
                            ratio((rec.get("compile_sdpa") or {}).get("median_ms"), g),
                            "",
                            f"{sp / MiB:.1f}" if isinstance(sp, (int, float)) else "n/a",
                            "",
                            "",
                            "",
                        ]
                    )
                    + " |"
                )
        lines += self.per_kernel_md()
        fails = [rec for rec in r["models"] if rec.get("errors")]
        if fails:
            lines.append("")
            lines.append("Problems:")
            for rec in fails:
                for err in rec["errors"]:
                    lines.append(f"- {rec['model']} {rec['dtype']}: {one_line(err, 800)}")
        return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU-capable)")
    ap.add_argument("--cpu", action="store_true", help="run torch on the CPU even when CUDA is available")
    ap.add_argument("--graphc", default=os.environ.get("GRAPHC", "target/release/graphc"))
    ap.add_argument("--out", default=os.environ.get("OUT") or "target/gpu-check")
    ap.add_argument("--scratch", default="/tmp/gpu_check/torch")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated models: names (mlp) or keys (gelu_sigmoid_f32, mlp_bf16, gpt_bf16, ...)",
    )
    ap.add_argument(
        "--exporter",
        choices=["auto", "torchscript", "dynamo"],
        default="auto",
        help="ONNX exporter (auto: TorchScript, then dynamo if that raises)",
    )
    ap.add_argument("--no-per-kernel", action="store_true", help="skip graphc bench --per-kernel on the GPT")
    ap.add_argument("--skip-compile", action="store_true", help="do not run torch.compile")
    ap.add_argument("--deadline", type=float, default=0, help="skip models that would start after this many seconds")
    ap.add_argument(
        "--graphc-timeout",
        type=float,
        default=0,
        help="seconds per graphc command (default 100, the GPT 1.5x; 60 --small)",
    )
    a = ap.parse_args()
    if not a.graphc_timeout:
        a.graphc_timeout = 60 if a.small else 100
    a.graphc = os.path.abspath(a.graphc) if os.path.sep in a.graphc else a.graphc
    os.makedirs(a.out, exist_ok=True)
    r = Runner(a)
    if not r.cuda and not a.small:
        print("error: no CUDA device; the full sizes need one (use --small to run on the CPU)", file=sys.stderr)
        return 3
    r.log(f"torch_compare: device {r.device}, graphc {a.graphc}, out {a.out}, scratch {a.scratch}")
    only = {s for s in a.only.split(",") if s}
    r.copy_baseline()
    for spec in specs(a.small):
        key = spec_key(spec)
        if only and key not in only and spec["name"] not in only:
            continue
        r.run_model(spec)
    r.results["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    r.results["meta"]["total_s"] = time.perf_counter() - r.t_start
    r.save()
    print()
    print(r.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
