#!/usr/bin/env python3
"""Materialize the ONNX backend *node* test cases shipped in the onnx wheel.

Usage (with the virtualenv from scripts/requirements-onnx.txt):

    python scripts/onnx_node_tests.py [OUT_DIR] [--copy] [--source DIR]

OUT_DIR defaults to target/onnx-node-tests (relative to the repository root).
The folder is removed and rebuilt on every run (idempotent).

Every case folder `onnx/backend/test/data/node/<case>/` (model.onnx plus
test_data_set_N/{input,output}_K.pb) is hard-linked (or copied with --copy,
or when hard links fail) to OUT_DIR/<case>/ unchanged, and OUT_DIR/index.tsv
gets one line per case, sorted by case name, with 4 tab-separated columns:

    case_name  tier  op_types  dtypes

tier      a | b | c | d | other (see TIERS below).  A case whose graph is one
          op type is classified by that op; `<X>_expanded` / `<X>_expanded_verN`
          get the tier of `<X>`; other multi-op cases get the op whose
          single-op cases share the longest `_`-token prefix with the name.
op_types  distinct op types in the graph (subgraphs and model-local functions
          included), in order of first appearance, comma-separated; ops outside
          the default ONNX domain are written `domain:Op`.
dtypes    distinct element types of all inputs and outputs of all test data
          sets (read from the .pb files, which are TensorProto for tensor
          values), comma-separated, in order of first appearance; names are
          f32 f16 bf16 f64 i64 i32 i8 u8 bool, anything else `other:N` with N
          the TensorProto.DataType number; non-tensor values (sequence,
          optional, map, sparse tensor) are written `other:seq`, `other:opt`,
          `other:map`, `other:sparse`.
"""
import argparse
import os
import re
import shutil
import sys
from pathlib import Path

import onnx
from onnx import TensorProto

TIERS = {
    "a": "Add Sub Mul Div Pow Mod Neg Abs Exp Log Sqrt Reciprocal Tanh Sigmoid Relu "
    "LeakyRelu Elu Selu Celu Gelu Erf Sin Cos Floor Ceil Round Sign Not IsNaN IsInf "
    "And Or Xor Equal Less LessOrEqual Greater GreaterOrEqual Max Min Sum Mean Where "
    "Cast CastLike Clip PRelu HardSwish HardSigmoid Mish Softplus Softsign ThresholdedRelu",
    "b": "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
    "ReduceLogSum ReduceLogSumExp ReduceSumSquare Softmax LogSoftmax LayerNormalization "
    "RMSNormalization ArgMax ArgMin CumSum",
    "c": "MatMul Gemm",
    "d": "Reshape Transpose Concat Slice Gather GatherElements Unsqueeze Squeeze Expand "
    "Split Flatten Shape Size Tile Pad Range ConstantOfShape Trilu OneHot Identity",
}
OP_TIER = {op: tier for tier, ops in TIERS.items() for op in ops.split()}
TIER_ORDER = ["a", "b", "c", "d", "other"]

DTYPE_NAMES = {
    TensorProto.FLOAT: "f32",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
    TensorProto.DOUBLE: "f64",
    TensorProto.INT64: "i64",
    TensorProto.INT32: "i32",
    TensorProto.INT8: "i8",
    TensorProto.UINT8: "u8",
    TensorProto.BOOL: "bool",
}
OUR_DTYPES = set(DTYPE_NAMES.values())
EXPANDED_RE = re.compile(r"_expanded(_ver\d+)?$")


def dtype_name(elem_type):
    return DTYPE_NAMES.get(elem_type, f"other:{elem_type}")


def op_name(node):
    if node.domain in ("", "ai.onnx"):
        return node.op_type
    return f"{node.domain}:{node.op_type}"


def graph_ops(graph, out):
    for node in graph.node:
        name = op_name(node)
        if name not in out:
            out.append(name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                graph_ops(attr.g, out)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    graph_ops(g, out)
    return out


def model_ops(model):
    ops = graph_ops(model.graph, [])
    for fn in model.functions:
        for node in fn.node:
            name = op_name(node)
            if name not in ops:
                ops.append(name)
    return ops


def value_kinds(values):
    """Map value name -> 'tensor' | 'seq' | 'opt' | 'map' | 'sparse'."""
    kinds = []
    for v in values:
        which = v.type.WhichOneof("value")
        kinds.append(
            {
                "tensor_type": "tensor",
                "sequence_type": "seq",
                "optional_type": "opt",
                "map_type": "map",
                "sparse_tensor_type": "sparse",
            }.get(which, "tensor")
        )
    return kinds


def pb_dtypes(case_dir, model):
    """Distinct dtypes of all input/output .pb files of all data sets."""
    graph = model.graph
    init_names = {i.name for i in graph.initializer}
    in_kinds = value_kinds([v for v in graph.input if v.name not in init_names])
    out_kinds = value_kinds(graph.output)
    seen = []
    for ds in sorted(case_dir.glob("test_data_set_*")):
        for prefix, kinds in (("input", in_kinds), ("output", out_kinds)):
            files = sorted(
                ds.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1])
            )
            for f in files:
                k = int(f.stem.split("_")[1])
                kind = kinds[k] if k < len(kinds) else "tensor"
                if kind == "tensor":
                    t = TensorProto()
                    t.ParseFromString(f.read_bytes())
                    name = dtype_name(t.data_type)
                else:
                    name = f"other:{kind}"
                if name not in seen:
                    seen.append(name)
    return seen


def tokens_prefix_len(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=str(repo / "target" / "onnx-node-tests"))
    ap.add_argument("--copy", action="store_true", help="copy instead of hard-linking")
    ap.add_argument("--source", help="node test data folder (default: from the onnx package)")
    args = ap.parse_args()

    src = Path(args.source) if args.source else (
        Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    )
    out = Path(args.out)
    if not src.is_dir():
        sys.exit(f"no node test data at {src}")

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    copy = shutil.copy2
    if not args.copy:
        def copy(s, d):
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)

    cases = {}
    for case_dir in sorted(p for p in src.iterdir() if (p / "model.onnx").is_file()):
        name = case_dir.name
        shutil.copytree(case_dir, out / name, copy_function=copy)
        model = onnx.load(str(case_dir / "model.onnx"), load_external_data=False)
        top = []
        for node in model.graph.node:
            if op_name(node) not in top:
                top.append(op_name(node))
        cases[name] = (model_ops(model), top, pb_dtypes(case_dir, model))

    # name -> op, from the non-expanded cases whose main graph is one op type
    single = {
        n: top[0]
        for n, (_, top, _) in cases.items()
        if len(top) == 1 and not EXPANDED_RE.search(n)
    }
    # per op: the common `_`-token prefix of its single-op case names
    op_prefix = {}
    for n, op in single.items():
        toks = n.split("_")
        if op in op_prefix:
            p = op_prefix[op]
            op_prefix[op] = p[: tokens_prefix_len(p, toks)]
        else:
            op_prefix[op] = toks

    def name_op(name):
        base = EXPANDED_RE.sub("", name)
        if base in single:
            return single[base]
        toks = base.split("_")
        best, best_len = None, 1  # need more than the "test" token
        for op, p in sorted(op_prefix.items()):
            if len(p) > best_len and toks[: len(p)] == p:
                best, best_len = op, len(p)
        return best

    counts = {t: [0, 0] for t in TIER_ORDER}
    lines = []
    unresolved = []
    resolved = []
    for name, (ops, top, dtypes) in sorted(cases.items()):
        if name in single:
            op = single[name]
        else:
            op = name_op(name)
            if op is None:
                unresolved.append(name)
            elif not EXPANDED_RE.search(name):
                resolved.append(f"{name}->{op}")
        tier = OP_TIER.get(op, "other")
        ours = all(d in OUR_DTYPES for d in dtypes)
        counts[tier][0] += 1
        counts[tier][1] += ours
        lines.append(f"{name}\t{tier}\t{','.join(ops)}\t{','.join(dtypes)}\n")

    (out / "index.tsv").write_text("".join(lines))

    print(f"{len(cases)} cases from {src}\n  -> {out}")
    print("tier  cases  only-our-dtypes")
    for t in TIER_ORDER:
        print(f"{t:5} {counts[t][0]:5}  {counts[t][1]:5}")
    if os.environ.get("VERBOSE"):
        print("multi-op cases classified by name prefix:", " ".join(resolved))
    if unresolved:
        print(f"{len(unresolved)} multi-op cases with no name op (tier other):",
              " ".join(unresolved[:20]), "..." if len(unresolved) > 20 else "")


if __name__ == "__main__":
    main()
