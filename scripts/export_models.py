#!/usr/bin/env python3
"""Export tiny random-weight transformer models to ONNX as test fixtures.

Usage (virtualenv with torch, transformers, onnxscript, onnx, onnxruntime; see
scripts/README.md for the exact versions):

    python scripts/export_models.py [--out tests/fixtures/onnx] [NAME ...]

For each model NAME (gpt2, bert, llama, vit; all by default) this builds the
model from a small config with fixed-seed random weights (never
from_pretrained), exports it with torch.onnx.export(..., dynamo=True) using
static shapes, runs PyTorch in f32 on fixed reference inputs and writes
OUT/NAME/:

    model.onnx        (+ model.onnx.data when the exporter writes external data)
    inputs.npz        arrays named exactly as the ONNX graph inputs
    outputs.npz       arrays named exactly as the ONNX graph outputs (PyTorch f32)
    meta.json         versions, config, opset, op type counts, shapes, symbolic
                      dims, onnx.checker result and ONNX Runtime vs PyTorch diffs

The folder OUT/NAME is removed and rebuilt on every run.
"""
import argparse
import collections
import functools
import json
import os
import shutil
import sys
import traceback
from pathlib import Path

import numpy as np
import onnx
import torch
import transformers

SEED = 0
PERTURB = 0.05  # std of the noise added to every parameter after HF init
BATCH, SEQ = 2, 16


# ---------------------------------------------------------------- models ---
class Logits(torch.nn.Module):
    """Causal LM wrapper: input_ids -> logits, no KV cache, plain tensor out."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False, return_dict=True).logits


class BertHidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out.last_hidden_state


class GptHidden(torch.nn.Module):
    """GPT2Model (no LM head): input_ids -> last hidden state, no KV cache."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False, return_dict=True).last_hidden_state


class VitHidden(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values):
        return self.m(pixel_values=pixel_values, return_dict=True).last_hidden_state


def ids(gen, vocab):
    return torch.randint(0, vocab, (BATCH, SEQ), generator=gen, dtype=torch.int64)


def build_gpt2(gen, attn="eager"):
    cfg = transformers.GPT2Config(
        vocab_size=128, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation=attn,
    )
    model = Logits(transformers.GPT2LMHeadModel(cfg))
    inputs = {"input_ids": ids(gen, cfg.vocab_size)}
    return cfg, model, inputs, ["logits"]


def build_gpt2_medium(gen, attn="eager"):
    """GPT-2-medium's shape (24 layers, d 1024, 16 heads, 1024 positions, the real
    vocabulary) with random weights: 355M parameters, 1.4 GB of f32 weights. Exported
    on demand only (never by default, never committed), into an ignored folder."""
    cfg = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation=attn,
    )
    model = GptHidden(transformers.GPT2Model(cfg))
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)}
    return cfg, model, inputs, ["last_hidden_state"]


def build_gpt2_48(gen, attn="eager"):
    """A 48-layer GPT-2 stack (d 256, 8 heads, 1024 positions, the real vocabulary),
    random weights (about 200 MB): for the bf16-vs-f32 arena and kernel-count check on
    a deep export. On demand only."""
    cfg = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=256, n_layer=48, n_head=8,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation=attn,
    )
    model = GptHidden(transformers.GPT2Model(cfg))
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)}
    return cfg, model, inputs, ["last_hidden_state"]


class LlamaHidden(torch.nn.Module):
    """LlamaModel (no LM head): input_ids -> last hidden state, no KV cache."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False, return_dict=True).last_hidden_state


def build_llama_1b(gen, attn="eager"):
    """A Llama-shaped model of about 1 B parameters (Llama-3.2-1B's layout: 16 layers,
    d 2048, 32 heads over 8 kv heads, MLP 8192; a 32000-token vocabulary), random
    weights: 4.2 GB of f32 weights as external data. On demand only, never committed."""
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, max_position_embeddings=2048,
        use_cache=False, attn_implementation=attn,
    )
    model = LlamaHidden(transformers.LlamaModel(cfg))
    inputs = {"input_ids": torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)}
    return cfg, model, inputs, ["last_hidden_state"]


def build_bert(gen, attn="eager", batch=BATCH):
    cfg = transformers.BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64,
        attn_implementation=attn,
    )
    model = BertHidden(transformers.BertModel(cfg, add_pooling_layer=False))
    mask = torch.ones(batch, SEQ, dtype=torch.int64)
    mask[1, SEQ - 5:] = 0  # second sequence is padded: last 5 tokens masked out
    mask[2:, :] = 0  # any further sequence is padding only: every key masked
    input_ids = torch.randint(0, cfg.vocab_size, (batch, SEQ), generator=gen, dtype=torch.int64)
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    return cfg, model, inputs, ["last_hidden_state"]


def build_llama(gen, attn="eager"):
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        use_cache=False, attn_implementation=attn,
    )
    model = Logits(transformers.LlamaForCausalLM(cfg))
    inputs = {"input_ids": ids(gen, cfg.vocab_size)}
    return cfg, model, inputs, ["logits"]


def build_vit(gen, attn="eager"):
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=64,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        attn_implementation=attn,
    )
    model = VitHidden(transformers.ViTModel(cfg, add_pooling_layer=False))
    pixels = torch.randn(BATCH, 3, 32, 32, generator=gen, dtype=torch.float32)
    inputs = {"pixel_values": pixels}
    return cfg, model, inputs, ["last_hidden_state"]


class Cfg(dict):
    """A plain config for the non-transformers models (the meta's `config`)."""

    def to_diff_dict(self):
        return dict(self)


class Images(torch.nn.Module):
    """An image classifier: pixel_values -> logits."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, pixel_values):
        return self.m(pixel_values)


class SmallCnn(torch.nn.Module):
    """Every CNN piece graphc lowers, small: conv + BatchNorm + ReLU, a strided and a
    dilated conv, a residual block, a depthwise conv with ReLU6, max pooling with
    ceil_mode, average pooling (count_include_pad both ways), a 1-D conv, global
    average pooling and a linear head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.res = nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=2, dilation=2, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16),
        )
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU6(), nn.Hardswish())
        self.grouped = nn.Conv2d(16, 24, 3, padding=1, groups=4)
        self.maxpool = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.avg_in = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=True)
        self.avg_ex = nn.AvgPool2d(2, stride=1, padding=1, count_include_pad=False)
        self.conv1d = nn.Conv1d(24, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.stem(x)
        x = self.down(x)
        x = torch.relu(x + self.res(x))
        x = self.dw(x)
        x = self.grouped(x)
        x = self.maxpool(x)
        x = self.avg_in(x) + self.avg_ex(x)[:, :, 1:, 1:]
        b, c, h, w = x.shape
        x = self.conv1d(x.reshape(b, c, h * w))
        return self.head(x.mean(dim=2))


def build_cnn(gen, size=32, batch=BATCH):
    model = Images(SmallCnn())
    # BatchNorm statistics that are not the identity.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    pixels = torch.randn(batch, 3, size, size, generator=gen, dtype=torch.float32)
    return Cfg(image_size=size), model, {"pixel_values": pixels}, ["logits"]


def build_torchvision(name, gen, size=64, batch=BATCH):
    import torchvision

    model = Images(getattr(torchvision.models, name)(weights=None))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    pixels = torch.randn(batch, 3, size, size, generator=gen, dtype=torch.float32)
    return Cfg(torchvision_model=name, image_size=size), model, {"pixel_values": pixels}, ["logits"]


INPUT_NOTES = {
    "gpt2": f"input_ids ~ randint(0, 128, [{BATCH}, {SEQ}]), generator seed {SEED}",
    "bert": f"input_ids ~ randint(0, 128, [{BATCH}, {SEQ}]), generator seed {SEED}; "
    "attention_mask all ones except [1, 11:] = 0 (second row padded)",
    "llama": f"input_ids ~ randint(0, 128, [{BATCH}, {SEQ}]), generator seed {SEED}",
    "vit": f"pixel_values ~ randn([{BATCH}, 3, 32, 32]), generator seed {SEED}",
}
INPUT_NOTES["gpt2_dynamic"] = INPUT_NOTES["gpt2"]
INPUT_NOTES["bert_sdpa"] = (
    f"input_ids ~ randint(0, 128, [3, {SEQ}]), generator seed {SEED}; attention_mask all ones "
    "except [1, 11:] = 0 (second row padded) and [2, :] = 0 (third row padding only)"
)
for _n in ("gpt2", "llama", "vit", "gpt2_dynamic"):
    INPUT_NOTES[f"{_n}_sdpa"] = INPUT_NOTES[_n]
INPUT_NOTES["llama_sdpa_opset23"] = INPUT_NOTES["llama"]
INPUT_NOTES["bert_sdpa_opset23"] = INPUT_NOTES["bert_sdpa"]
INPUT_NOTES["gpt2_dynamic_sdpa_opset23"] = INPUT_NOTES["gpt2"]
for _n in ("bert", "llama", "vit"):
    INPUT_NOTES[f"{_n}_dynamic"] = INPUT_NOTES[_n]
    INPUT_NOTES[f"{_n}_dynamic_sdpa"] = INPUT_NOTES[f"{_n}_sdpa"]
INPUT_NOTES["gpt2_48"] = f"input_ids ~ randint(0, 50257, [{BATCH}, {SEQ}]), generator seed {SEED}"
INPUT_NOTES["gpt2_medium_sdpa"] = INPUT_NOTES["gpt2_medium"] = f"input_ids ~ randint(0, 50257, [{BATCH}, {SEQ}]), generator seed {SEED}"
INPUT_NOTES["cnn"] = f"pixel_values ~ randn([{BATCH}, 3, 32, 32]), generator seed {SEED} (after the BatchNorm statistics)"
INPUT_NOTES["resnet50_train"] = f"pixel_values ~ randn([{BATCH}, 3, 224, 224]), generator seed {SEED} (after the BatchNorm statistics)"
for _n in ("resnet50", "mobilenet_v2", "squeezenet1_1"):
    INPUT_NOTES[_n] = f"pixel_values ~ randn([{BATCH}, 3, 64, 64]), generator seed {SEED} (after the BatchNorm statistics)"
INPUT_NOTES["llama_1b"] = f"input_ids ~ randint(0, 32000, [{BATCH}, {SEQ}]), generator seed {SEED}"

MODELS = {
    "gpt2": build_gpt2,
    "bert": build_bert,
    "llama": build_llama,
    "vit": build_vit,
    # The same GPT-2 exported with symbolic batch and sequence dims (ONNX dim_params
    # "batch" and "seq"), for `graphc fit` and --dim: every other fixture is static.
    "gpt2_dynamic": build_gpt2,
    # GPT-2-medium at full size, symbolic batch and seq: for `graphc fit` at seq 1024.
    "gpt2_medium": build_gpt2_medium,
    "gpt2_48": build_gpt2_48,
    # About 1 B parameters, Llama-shaped with GQA, symbolic batch and seq: the
    # big-model benchmark (bench/big_models.sh).
    "llama_1b": build_llama_1b,
    # The same families with transformers' default attention (scaled_dot_product_attention),
    # which the exporter decomposes differently: the scale split over q and kᵀ, a boolean
    # or additive mask, and `Where(IsNaN(p), 0, p)` after the softmax. bert_sdpa has a
    # third sequence that is padding only (every key masked).
    "gpt2_sdpa": functools.partial(build_gpt2, attn="sdpa"),
    "bert_sdpa": functools.partial(build_bert, attn="sdpa", batch=3),
    "llama_sdpa": functools.partial(build_llama, attn="sdpa"),
    "vit_sdpa": functools.partial(build_vit, attn="sdpa"),
    "gpt2_dynamic_sdpa": functools.partial(build_gpt2, attn="sdpa"),
    "gpt2_medium_sdpa": functools.partial(build_gpt2_medium, attn="sdpa"),
    # BERT, Llama and ViT with symbolic dims too (ViT: the batch only), in both forms.
    # torch.onnx.export at opset 23 spells SDPA as ONNX's own Attention op.
    "llama_sdpa_opset23": functools.partial(build_llama, attn="sdpa"),
    "bert_sdpa_opset23": functools.partial(build_bert, attn="sdpa", batch=3),
    "gpt2_dynamic_sdpa_opset23": functools.partial(build_gpt2, attn="sdpa"),
    "bert_dynamic": build_bert,
    "bert_dynamic_sdpa": functools.partial(build_bert, attn="sdpa", batch=3),
    "llama_dynamic": build_llama,
    "llama_dynamic_sdpa": functools.partial(build_llama, attn="sdpa"),
    "vit_dynamic": build_vit,
    "vit_dynamic_sdpa": functools.partial(build_vit, attn="sdpa"),
    # Convolutional networks (random weights, BatchNorm statistics drawn; dynamic batch):
    # a small one with every piece, and torchvision's (on demand).
    "cnn": build_cnn,
    "resnet50": functools.partial(build_torchvision, "resnet50"),
    "mobilenet_v2": functools.partial(build_torchvision, "mobilenet_v2"),
    "squeezenet1_1": functools.partial(build_torchvision, "squeezenet1_1"),
    # ResNet-50 at 224 x 224 with its BatchNorms kept (exported unoptimized), for
    # training steps (`graphc plan --train`, `graphc fit --train`).
    "resnet50_train": functools.partial(build_torchvision, "resnet50", size=224),
}

# Exported only when named (big weights; export them into an ignored folder such as
# target/models: `python scripts/export_models.py --out target/models gpt2_medium`).
ON_DEMAND = {
    "gpt2_medium", "gpt2_48", "llama_1b", "gpt2_medium_sdpa", "resnet50", "mobilenet_v2", "squeezenet1_1",
    "resnet50_train",
}

# Exported without torch.onnx's graph optimization (which folds BatchNorm into the
# convolutions: right for inference, but a training step needs the BatchNorms).
UNOPTIMIZED = {"resnet50_train"}

# Per model, the opset to export at (the exporter's default, 20, otherwise).
OPSET = {"llama_sdpa_opset23": 23, "bert_sdpa_opset23": 23, "gpt2_dynamic_sdpa_opset23": 23}

# Per model, torch.export dynamic shapes (None: static).
def _batch_seq(*names, seq_max=64):
    """Symbolic `batch` (axis 0) and, unless `seq_max` is None, `seq` (axis 1) of each
    named input."""

    def dims():
        d = {0: torch.export.Dim("batch", min=1, max=1 << 20)}
        if seq_max is not None:
            d[1] = torch.export.Dim("seq", min=1, max=seq_max)
        return d

    return lambda: {n: dims() for n in names}


DYNAMIC = {
    "bert_dynamic": _batch_seq("input_ids", "attention_mask"),
    "bert_dynamic_sdpa": _batch_seq("input_ids", "attention_mask"),
    "llama_dynamic": _batch_seq("input_ids"),
    "llama_dynamic_sdpa": _batch_seq("input_ids"),
    "vit_dynamic": _batch_seq("pixel_values", seq_max=None),
    "vit_dynamic_sdpa": _batch_seq("pixel_values", seq_max=None),
    "gpt2_dynamic": _batch_seq("input_ids"),
    "gpt2_dynamic_sdpa": _batch_seq("input_ids"),
    "gpt2_dynamic_sdpa_opset23": _batch_seq("input_ids"),
    "gpt2_medium": _batch_seq("input_ids", seq_max=1024),
    "gpt2_medium_sdpa": _batch_seq("input_ids", seq_max=1024),
    "gpt2_48": _batch_seq("input_ids", seq_max=1024),
    "llama_1b": _batch_seq("input_ids", seq_max=2048),
    "cnn": _batch_seq("pixel_values", seq_max=None),
    "resnet50": _batch_seq("pixel_values", seq_max=None),
    "mobilenet_v2": _batch_seq("pixel_values", seq_max=None),
    "squeezenet1_1": _batch_seq("pixel_values", seq_max=None),
    "resnet50_train": _batch_seq("pixel_values", seq_max=None),
}


# --------------------------------------------------------------- helpers ---
def versions():
    v = {"python": sys.version.split()[0]}
    for mod in ("torch", "transformers", "onnxscript", "onnx", "onnxruntime", "numpy"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            v[mod] = f"unavailable: {e}"
    return v


def count_ops(graph, counts):
    for node in graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
        counts[key] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count_ops(attr.g, counts)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    count_ops(g, counts)
    return counts


def value_info(v):
    t = v.type.tensor_type
    dims = []
    for d in t.shape.dim:
        dims.append(d.dim_param if d.HasField("dim_param") else d.dim_value)
    return {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name,
            "shape": dims}


def symbolic_dims(values, arrays):
    """dim_param names of graph inputs/outputs -> the values they take here."""
    sym = {}
    for v in values:
        if v.name not in arrays:
            continue
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_param") and d.dim_param:
                sym.setdefault(d.dim_param, int(arrays[v.name].shape[i]))
            elif not d.HasField("dim_value"):
                sym.setdefault(f"<unnamed {v.name}[{i}]>", int(arrays[v.name].shape[i]))
    return sym


def diff(ref, got):
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    return {
        "max_abs": float(np.max(np.abs(ref - got))),
        "rel_l2": float(np.linalg.norm(ref - got) / max(np.linalg.norm(ref), 1e-30)),
    }


def export_one(name, out_root):
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    cfg, model, inputs, output_names = MODELS[name](gen)
    model.eval()
    # HF init leaves norm scales at 1 and biases at 0 (and the exporter then
    # shares identical constants); perturb every parameter so that each one
    # is distinct and swapping scale/bias or dropping a bias shows up.
    pgen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=pgen, dtype=p.dtype) * PERTURB)
    attn_impl = getattr(cfg, "_attn_implementation", None)

    out = out_root / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    path = out / "model.onnx"

    with torch.no_grad():
        ref = model(**inputs)
        program = torch.onnx.export(
            model,
            (),
            kwargs=inputs,
            f=str(path),
            dynamo=True,
            input_names=list(inputs),
            output_names=output_names,
            dynamic_shapes=DYNAMIC[name]() if name in DYNAMIC else None,
            optimize=name not in UNOPTIMIZED,
            **({"opset_version": OPSET[name]} if name in OPSET else {}),
        )
    del program
    files = sorted(p.name for p in out.iterdir())

    onnx.checker.check_model(str(path), full_check=True)
    # The graph only: the weights stay in their external data file (GBs for the
    # on-demand models).
    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    init_names = {i.name for i in graph.initializer}
    g_inputs = [v for v in graph.input if v.name not in init_names]
    g_outputs = list(graph.output)
    in_names = [v.name for v in g_inputs]
    out_names = [v.name for v in g_outputs]
    if sorted(in_names) != sorted(inputs):
        raise RuntimeError(f"graph inputs {in_names} != {list(inputs)}")
    if len(out_names) != 1:
        raise RuntimeError(f"expected one graph output, got {out_names}")

    in_arrays = {k: inputs[k].numpy() for k in in_names}
    out_arrays = {out_names[0]: ref.detach().numpy().astype(np.float32)}
    np.savez(out / "inputs.npz", **in_arrays)
    np.savez(out / "outputs.npz", **out_arrays)
    eager_arrays = None
    if attn_impl == "sdpa":
        # The same model and weights with eager attention. The exported graph spells
        # transformers' mask with the dtype's lowest (finite), so a sequence that is
        # padding only attends uniformly to its padded keys, as eager attention does;
        # PyTorch's fused SDPA kernel gives such a row something else at run time.
        # outputs_eager.npz is what the graph defines for such rows.
        model.m.set_attn_implementation("eager")
        with torch.no_grad():
            eager = model(**inputs)
        model.m.set_attn_implementation("sdpa")
        eager_arrays = {out_names[0]: eager.detach().numpy().astype(np.float32)}
        np.savez(out / "outputs_eager.npz", **eager_arrays)
        files = sorted(p.name for p in out.iterdir())

    ort = {}
    try:
        import onnxruntime

        sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, in_arrays)
        ort = {"ran": True, **diff(out_arrays[out_names[0]], got[0])}
        if eager_arrays is not None:
            ort["vs_eager"] = diff(eager_arrays[out_names[0]], got[0])
            # Per batch row: how far PyTorch's SDPA output is from the graph's (ORT).
            ref0, got0 = out_arrays[out_names[0]], got[0]
            ort["max_abs_per_batch_row"] = [
                float(np.max(np.abs(ref0[i].astype(np.float64) - got0[i]))) for i in range(ref0.shape[0])
            ]
    except Exception as e:  # noqa: BLE001
        ort = {"ran": False, "error": f"{type(e).__name__}: {e}"}

    counts = count_ops(graph, collections.Counter())
    fn_counts = {}
    for fn in proto.functions:
        fn_counts[f"{fn.domain}:{fn.name}"] = dict(
            sorted(count_ops(fn, collections.Counter()).items()))
    opsets = {(o.domain or "ai.onnx"): o.version for o in proto.opset_import}
    sym = symbolic_dims(g_inputs, in_arrays)
    sym.update(symbolic_dims(g_outputs, out_arrays))

    try:
        cfg_dict = cfg.to_diff_dict()
    except Exception:  # noqa: BLE001
        cfg_dict = cfg.to_dict()
    meta = {
        "name": name,
        "model_class": type(model.m).__name__,
        "wrapper": type(model).__name__,
        "attn_implementation": attn_impl,
        "seed": SEED,
        "weights": f"HF random init with torch.manual_seed({SEED}), then every parameter "
        f"+= {PERTURB} * randn (generator seed {SEED + 1})",
        "reference_inputs": INPUT_NOTES[name],
        "versions": versions(),
        "config": json.loads(json.dumps(cfg_dict, default=str)),
        "export": "torch.onnx.export(model, (), kwargs=inputs, dynamo=True), "
        + ("dynamic shapes: " + str(DYNAMIC[name]()) if name in DYNAMIC else "static shapes"),
        "opset": opsets.get("ai.onnx"),
        "opset_import": opsets,
        "ir_version": proto.ir_version,
        "files": {f: (out / f).stat().st_size for f in files},
        "external_data": any(f != "model.onnx" for f in files),
        "inputs": [value_info(v) for v in g_inputs],
        "outputs": [value_info(v) for v in g_outputs],
        "symbolic_dims": sym,
        "num_nodes": sum(counts.values()),
        "num_initializers": len(graph.initializer),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "op_types": dict(sorted(counts.items())),
        "functions": fn_counts,
        "onnx_checker": "ok (full_check)",
        "onnxruntime_vs_pytorch": ort,
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main():
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(repo / "tests" / "fixtures" / "onnx"))
    ap.add_argument("names", nargs="*", metavar="NAME", help=" | ".join(MODELS))
    args = ap.parse_args()
    for n in args.names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    out_root = Path(args.out)
    failed = []
    for name in args.names or [m for m in MODELS if m not in ON_DEMAND]:
        print(f"== {name}", flush=True)
        try:
            meta = export_one(name, out_root)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed.append(name)
            continue
        print(f"   opset {meta['opset']}, {meta['num_nodes']} nodes, files {meta['files']}, "
              f"symbolic {meta['symbolic_dims']}, ort {meta['onnxruntime_vs_pytorch']}")
        print("   ops", meta["op_types"], flush=True)
    if failed:
        print("FAILED:", " ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
