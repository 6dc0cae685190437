#!/usr/bin/env python3
"""Write an ONNX model of one Sum node with many operands (issue 28: a value named
100,000 times), for timing `graphc plan` by hand.

Usage (the onnx venv of scripts/README.md):

    python scripts/sum_model.py N MODE OUT.onnx

MODE: `same` (every operand is input `x`), `half` (every other operand is `x`, the
rest inputs `x1`, `x3`, ... of their own) or `distinct` (operand i is input `x{i}`).
Every input and the output `y` are f32 [4]; opset 13.
"""
import sys

import onnx
from onnx import TensorProto, helper


def main():
    if len(sys.argv) != 4 or sys.argv[2] not in ("same", "half", "distinct"):
        sys.exit(__doc__)
    n, mode, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "same":
        names = ["x"] * n
    elif mode == "half":
        names = ["x" if i % 2 == 0 else f"x{i}" for i in range(n)]
    else:
        names = [f"x{i}" for i in range(n)]
    inputs = list(dict.fromkeys(names))
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [4])
    graph = helper.make_graph(
        [helper.make_node("Sum", names, ["y"])], "sum", [value(i) for i in inputs], [value("y")]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), out)


if __name__ == "__main__":
    main()
