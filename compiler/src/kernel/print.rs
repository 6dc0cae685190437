//! A readable, stable text form of a [`Program`] (for `graphc opt` and snapshots).

use std::fmt::Write;

use super::{
    Access, Body, BufferKind, ElementwiseKernel, Expr, KernelKind, MatMulKernel, OpKernel, Program, RowKernel, Stage,
    Store,
};

/// Print a program: buffers, then each kernel with the IR nodes it fused, its inputs,
/// body and stores.
pub fn print_program(p: &Program) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "program: {} kernels, {} buffers", p.kernels.len(), p.buffers.len());
    for (i, b) in p.buffers.iter().enumerate() {
        let kind = match &b.kind {
            BufferKind::Input { name } => format!("input {name:?}"),
            BufferKind::Weight { name } => format!("weight {name:?}"),
            BufferKind::Constant { .. } => "constant".to_string(),
            BufferKind::Temp => "temp".to_string(),
        };
        let _ = write!(s, "  b{i}: {} {kind}", b.ty);
        if let Some(n) = &b.name {
            let _ = write!(s, " ({n})");
        }
        let outs: Vec<&str> = p
            .outputs
            .iter()
            .filter(|(_, id)| id.index() == i)
            .map(|(n, _)| n.as_str())
            .collect();
        if !outs.is_empty() {
            let _ = write!(s, " -> output {}", outs.join(", "));
        }
        s.push('\n');
    }
    for (ki, k) in p.kernels.iter().enumerate() {
        let nodes: Vec<String> = k.nodes.iter().map(|n| format!("%{n}")).collect();
        let _ = write!(s, "k{ki} {} {}", k.name, k.kind_name());
        match &k.kind {
            KernelKind::Elementwise(ElementwiseKernel {
                space,
                inputs,
                body,
                stores,
            }) => {
                let _ = writeln!(s, " {space:?} nodes [{}]", nodes.join(" "));
                print_inputs(&mut s, inputs);
                print_body(&mut s, body);
                print_stores(&mut s, "store", stores);
            }
            KernelKind::Row(RowKernel {
                outer,
                inner,
                inputs,
                body,
                stages,
                row_stores,
                stores,
            }) => {
                let _ = writeln!(s, " outer {outer:?} inner {inner:?} nodes [{}]", nodes.join(" "));
                print_inputs(&mut s, inputs);
                print_body(&mut s, body);
                print_stages(&mut s, stages);
                print_stores(&mut s, "row store", row_stores);
                print_stores(&mut s, "store", stores);
            }
            KernelKind::MatMul(MatMulKernel {
                batch,
                m,
                n,
                k: kk,
                a,
                b,
                inputs,
                body,
                stores,
                quant,
                bias_grad,
            }) => {
                let _ = writeln!(s, " batch {batch:?} m {m} n {n} k {kk} nodes [{}]", nodes.join(" "));
                let _ = writeln!(s, "    a = {}", access(a));
                match quant {
                    Some(q) => {
                        let _ = writeln!(
                            s,
                            "    b = {} int{} scales b{} group {}",
                            access(b),
                            q.bits,
                            q.scales.0,
                            q.group
                        );
                    }
                    None => {
                        let _ = writeln!(s, "    b = {}", access(b));
                    }
                }
                print_inputs(&mut s, inputs);
                print_body(&mut s, body);
                print_stores(&mut s, "store", stores);
                if let Some(g) = bias_grad {
                    let which = match g.operand {
                        crate::kernel::Operand::A => "a",
                        crate::kernel::Operand::B => "b",
                    };
                    let _ = writeln!(s, "    bias grad sum over k of {which} -> {}", access(&g.store));
                }
            }
            KernelKind::Op(OpKernel {
                op,
                inputs,
                output,
                siblings,
            }) => {
                let _ = writeln!(s, " nodes [{}]", nodes.join(" "));
                let attrs = serde_json::to_string(op).unwrap_or_default();
                let _ = writeln!(s, "    op {attrs}");
                for (i, (a, ty)) in inputs.iter().enumerate() {
                    let _ = writeln!(s, "    in{i} = {} as {ty}", access(a));
                }
                let _ = writeln!(s, "    out = b{}", output.0);
                for sib in siblings {
                    let attrs = serde_json::to_string(&sib.op).unwrap_or_default();
                    let ins: Vec<String> = sib.inputs.iter().map(|i| format!("in{i}")).collect();
                    let _ = writeln!(s, "    also op {attrs} of {} -> b{}", ins.join(" "), sib.output.0);
                }
            }
            KernelKind::Conv(c) => {
                let _ = writeln!(s, " {:?} groups {} nodes [{}]", c.space(), c.groups, nodes.join(" "));
                let attrs = serde_json::to_string(&c.window).unwrap_or_default();
                let _ = writeln!(s, "    window {attrs}");
                let _ = writeln!(s, "    x = {} over {:?}", access(&c.x), c.x_dims);
                let _ = writeln!(s, "    w = {} over {:?}", access(&c.w), c.w_dims);
                print_inputs(&mut s, &c.inputs);
                print_body(&mut s, &c.body);
                print_stores(&mut s, "store", &c.stores);
            }
            KernelKind::MultiTensor(m) => {
                let _ = writeln!(s, " {} parts nodes [{}]", m.parts.len(), nodes.join(" "));
                for (i, part) in m.parts.iter().enumerate() {
                    let _ = writeln!(s, "  part {i} {:?}", part.space);
                    print_inputs(&mut s, &part.inputs);
                    match m.parts[..i].iter().position(|q| q.body == part.body) {
                        Some(j) => {
                            let _ = writeln!(s, "    body of part {j}");
                        }
                        None => print_body(&mut s, &part.body),
                    }
                    print_stores(&mut s, "store", &part.stores);
                }
            }
        }
    }
    s
}

fn access(a: &Access) -> String {
    format!("b{}[{} + {:?}]", a.buffer.0, a.offset, a.strides)
}

fn print_inputs(s: &mut String, inputs: &[Access]) {
    for (i, a) in inputs.iter().enumerate() {
        let _ = writeln!(s, "    in{i} = {}", access(a));
    }
}

fn print_body(s: &mut String, body: &Body) {
    for (i, (e, dt)) in body.exprs.iter().enumerate() {
        let rhs = match e {
            Expr::Load(n) => format!("load in{n}"),
            Expr::Const(t) => format!("const {}", t.to_f64_vec().first().copied().unwrap_or(0.0)),
            Expr::Index(a) => format!("index {a}"),
            Expr::Unary(u, x) => format!("{} e{x}", u.name()),
            Expr::Binary(b, x, y) => format!("{} e{x} e{y}", b.name()),
            Expr::Select(c, x, y) => format!("select e{c} e{x} e{y}"),
            Expr::Cast(x) => format!("cast e{x}"),
            Expr::Stage(n) => format!("stage {n}"),
            Expr::Gather {
                input,
                index,
                stride,
                extent,
            } => format!("gather in{input} e{index} * {stride} (of {extent})"),
            Expr::Acc => "acc".to_string(),
        };
        let _ = writeln!(s, "    e{i}: {dt} = {rhs}");
    }
}

fn print_stages(s: &mut String, stages: &[Stage]) {
    for (i, st) in stages.iter().enumerate() {
        let _ = writeln!(s, "    stage {i} = {} e{}", st.op.name(), st.value);
    }
}

fn print_stores(s: &mut String, what: &str, stores: &[Store]) {
    for st in stores {
        let _ = writeln!(s, "    {what} e{} -> {}", st.value, access(&st.access));
    }
}

/// The printed IR of a graph (`graphc_ir::print`) with each node line annotated by the
/// kernel that computes it (`# k3 row_max_sum`), or `# view` for views folded into
/// their consumers' indexing. The result still parses as IR (annotations are comments).
pub fn annotate_ir(ir_text: &str, p: &Program) -> String {
    let mut kernel_of = std::collections::HashMap::new();
    for (i, k) in p.kernels.iter().enumerate() {
        for &n in &k.nodes {
            kernel_of.entry(n).or_insert_with(|| format!("k{i} {}", k.kind_name()));
        }
    }
    let mut out = String::with_capacity(ir_text.len() * 2);
    for line in ir_text.lines() {
        out.push_str(line);
        let t = line.trim_start();
        let number = t
            .strip_prefix('%')
            .and_then(|r| r.split_once(' '))
            .filter(|(_, rest)| rest.starts_with("= "))
            .and_then(|(n, _)| n.parse::<u32>().ok());
        if let Some(n) = number {
            let is_source = ["input", "param", "constant"].iter().any(|w| {
                t.split_once("= ")
                    .is_some_and(|(_, rhs)| rhs.starts_with(w) && !rhs.starts_with("constant_"))
            });
            match kernel_of.get(&n) {
                Some(k) => {
                    let _ = write!(out, "  # {k}");
                }
                None if !is_source => out.push_str("  # view"),
                None => {}
            }
        }
        out.push('\n');
    }
    out
}
