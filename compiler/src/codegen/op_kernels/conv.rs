//! Direct kernels of convolution and pooling and their gradients ([`Op::Conv`],
//! [`Op::ConvGrad`], [`Op::Pool`], [`Op::PoolGrad`]): one thread per output element,
//! looping over the taps (or the outputs a tap feeds) in the order the interpreter
//! sums them, accumulating in f32 (f64 for f64) and rounding once at the store.
//! Operands are read through their accesses; a tap outside the input reads nothing.

use graphc_ir::{ConvGeom, ConvOperand, DType, Op, PoolOp, Window};

use super::super::cuda::{self, Writer};
use super::super::layout::{self, Ix};
use super::super::prelude::Helpers;
use super::super::CodegenError;
use super::Gen;
use crate::kernel::Access;

impl Gen<'_> {
    fn acc_type(&self) -> &'static str {
        if self.out.dtype == DType::F64 {
            "double"
        } else {
            "float"
        }
    }

    /// A read of operand `k` at coordinates `{prefix}0..` (declared by the caller).
    fn read(&self, h: &mut Helpers, ix: Ix, k: usize, prefix: &str) -> String {
        let (a, ty): &(Access, _) = &self.inputs[k];
        let addr = layout::address(ix, a.offset, &a.strides, prefix);
        cuda::load_conv(h, ty.dtype, &format!("p{}[{addr}]", self.in_param[k]))
    }

    fn store(&self, w: &mut Writer, h: &mut Helpers, value: &str) {
        let d = self.out.dtype;
        let v = cuda::store_conv(h, d, &format!("({})({value})", cuda::reg_type(d)));
        w.line(format!("p{}[i] = {v};", self.out_param));
    }

    /// [`Op::Conv`] and [`Op::ConvGrad`].
    pub(super) fn conv(&self, w: &mut Writer, h: &mut Helpers, ix: Ix, op: &Op) -> Result<&'static str, CodegenError> {
        let dims = |k: usize| self.inputs[k].1.shape.dims().to_vec();
        let geom = match op {
            Op::Conv { window, groups } => ConvGeom::new(window, *groups, &dims(0), &dims(1)),
            Op::ConvGrad {
                wrt: ConvOperand::Input,
                window,
                groups,
                shape,
            } => ConvGeom::new(window, *groups, shape.dims(), &dims(1)),
            Op::ConvGrad {
                window, groups, shape, ..
            } => ConvGeom::new(window, *groups, &dims(0), shape.dims()),
            _ => return Err(self.cx.malformed(format!("{} is not a convolution", op.name()))),
        };
        let g = geom.map_err(|m| self.cx.malformed(m))?;
        let t = ix.ty();
        let acc = self.acc_type();
        let (cg, og) = (g.c / g.groups, g.o / g.groups);
        let r = g.axes.len();
        let lit = |n: usize| ix.lit(n as i64);
        w.line(format!("{acc} acc = 0;"));
        match op {
            Op::Conv { .. } => {
                let read = |h: &mut Helpers, operand: &str| self.read(h, ix, usize::from(operand == "w"), operand);
                super::super::conv::emit_sum(w, h, ix, &g, acc, &read);
                self.store(w, h, "acc");
                return Ok("conv");
            }
            Op::ConvGrad {
                wrt: ConvOperand::Input,
                ..
            } => {
                // out (b, c, p..): sum over j of the group, then taps, of dy[b, j, q..] w[j, i, t..]
                w.line(format!("const {t} grp = o1 / {}, ci = o1 % {};", lit(cg), lit(cg)));
                w.open(format!(
                    "for ({t} j = grp * {og}; j < (grp + 1) * {og}; ++j)",
                    og = lit(og)
                ));
                for (k, a) in g.axes.iter().enumerate() {
                    w.open(format!("for ({t} t{k} = 0; t{k} < {}; ++t{k})", lit(a.kernel)));
                    w.line(format!(
                        "const {t} s{k} = o{} + {} - t{k} * {};",
                        k + 2,
                        lit(a.pad_lo),
                        lit(a.dilation)
                    ));
                    w.line(format!(
                        "if (s{k} < 0 || s{k} % {st} != 0 || s{k} / {st} >= {}) continue;",
                        lit(a.out),
                        st = lit(a.stride)
                    ));
                    w.line(format!("const {t} q{k} = s{k} / {};", lit(a.stride)));
                }
                self.coords(w, ix, "d", &["o0".into(), "j".into()], "q", r);
                self.coords(w, ix, "w", &["j".into(), "ci".into()], "t", r);
                let (dv, wv) = (self.read(h, ix, 0, "d"), self.read(h, ix, 1, "w"));
                w.line(format!("acc += ({acc}){wv} * ({acc}){dv};"));
            }
            _ => {
                // out (j, i, t..): sum over b, then outputs, of dy[b, j, q..] x[b, grp cg + i, tap..]
                w.line(format!("const {t} grp = o0 / {};", lit(og)));
                w.open(format!("for ({t} b = 0; b < {}; ++b)", lit(g.n)));
                for (k, a) in g.axes.iter().enumerate() {
                    w.open(format!("for ({t} q{k} = 0; q{k} < {}; ++q{k})", lit(a.out)));
                    w.line(format!(
                        "const {t} ip{k} = q{k} * {} + o{} * {} - {};",
                        lit(a.stride),
                        k + 2,
                        lit(a.dilation),
                        lit(a.pad_lo)
                    ));
                    w.line(format!("if (ip{k} < 0 || ip{k} >= {}) continue;", lit(a.len)));
                }
                self.coords(w, ix, "x", &["b".into(), format!("grp * {} + o1", lit(cg))], "ip", r);
                self.coords(w, ix, "d", &["b".into(), "o0".into()], "q", r);
                let (xv, dv) = (self.read(h, ix, 0, "x"), self.read(h, ix, 1, "d"));
                w.line(format!("acc += ({acc}){dv} * ({acc}){xv};"));
            }
        }
        for _ in 0..=r {
            w.close();
        }
        self.store(w, h, "acc");
        Ok(match op {
            Op::Conv { .. } => "conv",
            _ => "conv_grad",
        })
    }

    /// Declares `{name}0, {name}1` as `lead` and `{name}{2+k}` as `{spatial}{k}`.
    fn coords(&self, w: &mut Writer, ix: Ix, name: &str, lead: &[String], spatial: &str, r: usize) {
        let t = ix.ty();
        let mut parts: Vec<String> = lead
            .iter()
            .enumerate()
            .map(|(k, e)| format!("{name}{k} = {e}"))
            .collect();
        parts.extend((0..r).map(|k| format!("{name}{} = {spatial}{k}", k + 2)));
        w.line(format!("const {t} {};", parts.join(", ")));
    }

    /// [`Op::Pool`] and [`Op::PoolGrad`].
    pub(super) fn pool(&self, w: &mut Writer, h: &mut Helpers, ix: Ix, op: &Op) -> Result<&'static str, CodegenError> {
        let (Op::Pool {
            op: pool,
            kernel,
            window,
            ceil_mode,
            count_include_pad,
        }
        | Op::PoolGrad {
            op: pool,
            kernel,
            window,
            ceil_mode,
            count_include_pad,
        }) = op
        else {
            return Err(self.cx.malformed(format!("{} is not a pooling", op.name())));
        };
        let x = self.inputs[0].1.shape.dims();
        let spatial = x.get(2..).unwrap_or_default();
        let axes = Window::axes(window, spatial, kernel, *ceil_mode).map_err(|m| self.cx.malformed(m))?;
        let t = ix.ty();
        let acc = self.acc_type();
        let lit = |n: usize| ix.lit(n as i64);
        let r = axes.len();
        let grad = matches!(op, Op::PoolGrad { .. });
        // The window of output `q{k}` (variables named by `qn`): its inside taps, then
        // its value (`best` and `arg{k}` for max; `sum` and `cnt` for avg).
        let window_value = |w: &mut Writer, h: &mut Helpers, qn: &str| {
            if *pool == PoolOp::Max {
                w.line(format!("{acc} best = 0; bool any = false;"));
                for k in 0..r {
                    w.line(format!("{t} arg{k} = -1;"));
                }
            } else {
                w.line(format!("{acc} sum = 0; {t} cnt = 1;"));
                for (k, a) in axes.iter().enumerate() {
                    // the divisor's taps along axis k: inside the input, or the padded input
                    let (from, to) = if *count_include_pad {
                        (format!("-{}", lit(a.pad_lo)), lit(a.len + a.pad_hi))
                    } else {
                        ("0".to_string(), lit(a.len))
                    };
                    w.line(format!("{t} n{k} = 0;"));
                    w.open(format!("for ({t} u = 0; u < {}; ++u)", lit(a.kernel)));
                    w.line(format!(
                        "const {t} pp = {qn}{k} * {} + u * {} - {};",
                        lit(a.stride),
                        lit(a.dilation),
                        lit(a.pad_lo)
                    ));
                    w.line(format!("if (pp >= {from} && pp < {to}) ++n{k};"));
                    w.close();
                    w.line(format!("cnt *= n{k};"));
                }
            }
            for (k, a) in axes.iter().enumerate() {
                w.open(format!("for ({t} t{k} = 0; t{k} < {}; ++t{k})", lit(a.kernel)));
                w.line(format!(
                    "const {t} ip{k} = {qn}{k} * {} + t{k} * {} - {};",
                    lit(a.stride),
                    lit(a.dilation),
                    lit(a.pad_lo)
                ));
                w.line(format!("if (ip{k} < 0 || ip{k} >= {}) continue;", lit(a.len)));
            }
            self.coords(w, ix, "x", &["o0".into(), "o1".into()], "ip", r);
            let xv = self.read(h, ix, 0, "x");
            w.line(format!("const {acc} v = ({acc}){xv};"));
            if *pool == PoolOp::Max {
                // the first largest wins; a NaN, once met, stays
                w.open("if (!any || (!(best != best) && (v > best || v != v)))");
                w.line("best = v; any = true;");
                for k in 0..r {
                    w.line(format!("arg{k} = ip{k};"));
                }
                w.close();
            } else {
                w.line("sum += v;");
            }
            for _ in 0..r {
                w.close();
            }
        };
        if !grad {
            let q: Vec<String> = (0..r).map(|k| format!("qq{k} = o{}", k + 2)).collect();
            w.line(format!("const {t} {};", q.join(", ")));
            window_value(w, h, "qq");
            if *pool == PoolOp::Max {
                let ninf = if acc == "double" {
                    cuda::f64_lit(f64::NEG_INFINITY)
                } else {
                    cuda::f32_lit(f32::NEG_INFINITY)
                };
                w.line(format!("if (!any) best = {ninf};"));
                self.store(w, h, "best");
            } else {
                self.store(w, h, &format!("cnt == 0 ? ({acc})0 : sum / ({acc})cnt"));
            }
            return Ok("pool");
        }
        // The gradient at input (b, c, p..): every output whose window holds it, in
        // increasing row-major order.
        w.line(format!("{acc} acc = 0;"));
        for (k, a) in axes.iter().enumerate() {
            w.open(format!("for ({t} qq{k} = 0; qq{k} < {}; ++qq{k})", lit(a.out)));
            w.line(format!(
                "const {t} e{k} = o{} + {} - qq{k} * {};",
                k + 2,
                lit(a.pad_lo),
                lit(a.stride)
            ));
            w.line(format!(
                "if (e{k} < 0 || e{k} % {d} != 0 || e{k} / {d} >= {}) continue;",
                lit(a.kernel),
                d = lit(a.dilation)
            ));
        }
        w.open("");
        window_value(w, h, "qq");
        self.coords(w, ix, "d", &["o0".into(), "o1".into()], "qq", r);
        let dv = self.read(h, ix, 1, "d");
        if *pool == PoolOp::Max {
            let hit: Vec<String> = (0..r).map(|k| format!("arg{k} == o{}", k + 2)).collect();
            w.line(format!("if (any && {}) acc += ({acc}){dv};", hit.join(" && ")));
        } else {
            w.line(format!("if (cnt != 0) acc += ({acc}){dv} / ({acc})cnt;"));
        }
        w.close();
        for _ in 0..r {
            w.close();
        }
        self.store(w, h, "acc");
        Ok("pool_grad")
    }
}
