//! Attribute decoding: a node's `{key=value, ...}` list taken one attribute at a time
//! as its op needs them, each value checked against the type the op expects (integers,
//! lists, shapes, dtypes, slice ranges, pads). Numbers and tensor literals are in
//! [`super::literal`].

use super::lex::snippet;
use super::parse::{check_dims, Pos, Val, ValKind};
use super::ParseError;
use crate::op::OpKind;
use crate::{DType, Op, PadMode, Shape, SliceRange, TensorType};

/// The attributes of one node, taken one by one as the op needs them.
pub(super) struct Attrs<'a> {
    pub(super) src: &'a str,
    pub(super) op: &'a str,
    pub(super) op_pos: Pos,
    pub(super) list: Vec<(String, Pos, Val)>,
}

impl Attrs<'_> {
    /// The op of a node of kind `kind` (not an input or parameter) and type `ty`, its
    /// attributes taken from the list.
    pub(super) fn op(&mut self, kind: OpKind, ty: &TensorType) -> Result<Op, ParseError> {
        let attrs = self;
        Ok(match kind {
            OpKind::Input | OpKind::Parameter => {
                return Err(attrs.op_pos.err(format!("{} is bound by name", attrs.op)));
            }
            OpKind::Constant => {
                let v = attrs.required("value")?;
                Op::Constant {
                    value: attrs.tensor(&v, ty)?,
                }
            }
            OpKind::Iota => {
                let v = attrs.required("axis")?;
                Op::Iota {
                    ty: ty.clone(),
                    axis: attrs.usize(&v, "axis")?,
                }
            }
            OpKind::Unary(u) => Op::Unary(u),
            OpKind::Binary(b) => Op::Binary(b),
            OpKind::Select => Op::Select,
            OpKind::MatMul => Op::MatMul,
            OpKind::Cast => {
                let v = attrs.required("to")?;
                Op::Cast {
                    to: attrs.dtype(&v, "to")?,
                }
            }
            OpKind::Broadcast => {
                let v = attrs.required("shape")?;
                Op::Broadcast {
                    shape: attrs.shape(&v, "shape")?,
                }
            }
            OpKind::Reshape => {
                let v = attrs.required("shape")?;
                Op::Reshape {
                    shape: attrs.shape(&v, "shape")?,
                }
            }
            OpKind::Reduce(op) => {
                let a = attrs.required("axes")?;
                let k = attrs.required("keepdims")?;
                Op::Reduce {
                    op,
                    axes: attrs.usizes(&a, "axes")?,
                    keepdims: attrs.bool(&k, "keepdims")?,
                }
            }
            OpKind::ArgReduce(op) => {
                let a = attrs.required("axis")?;
                let k = attrs.required("keepdims")?;
                Op::ArgReduce {
                    op,
                    axis: attrs.usize(&a, "axis")?,
                    keepdims: attrs.bool(&k, "keepdims")?,
                }
            }
            OpKind::Transpose => {
                let v = attrs.required("perm")?;
                Op::Transpose {
                    perm: attrs.usizes(&v, "perm")?,
                }
            }
            OpKind::Slice => {
                let v = attrs.required("ranges")?;
                Op::Slice {
                    ranges: attrs.ranges(&v)?,
                }
            }
            OpKind::Concat => {
                let v = attrs.required("axis")?;
                Op::Concat {
                    axis: attrs.usize(&v, "axis")?,
                }
            }
            OpKind::Gather => {
                let v = attrs.required("axis")?;
                Op::Gather {
                    axis: attrs.usize(&v, "axis")?,
                }
            }
            OpKind::ScatterAdd => {
                let a = attrs.required("axis")?;
                let n = attrs.required("size")?;
                Op::ScatterAdd {
                    axis: attrs.usize(&a, "axis")?,
                    size: attrs.usize(&n, "size")?,
                }
            }
            OpKind::Pad => {
                let p = attrs.required("pads")?;
                let m = attrs.required("mode")?;
                let v = attrs.required("value")?;
                Op::Pad {
                    pads: attrs.pads(&p)?,
                    mode: attrs.mode(&m)?,
                    value: attrs.f64(&v, "value")?,
                }
            }
            OpKind::Attention => {
                let v = attrs.required("scale")?;
                let c = attrs.required("causal")?;
                let z = match attrs.take("zero_masked_rows") {
                    Some(z) => attrs.bool(&z, "zero_masked_rows")?,
                    None => false,
                };
                Op::Attention {
                    scale: attrs.f64(&v, "scale")?,
                    causal: attrs.bool(&c, "causal")?,
                    zero_masked_rows: z,
                }
            }
            OpKind::AttentionLse => {
                let v = attrs.required("scale")?;
                let c = attrs.required("causal")?;
                Op::AttentionLse {
                    scale: attrs.f64(&v, "scale")?,
                    causal: attrs.bool(&c, "causal")?,
                }
            }
            OpKind::AttentionGrad => {
                let w = attrs.required("wrt")?;
                let v = attrs.required("scale")?;
                let c = attrs.required("causal")?;
                let z = match attrs.take("zero_masked_rows") {
                    Some(z) => attrs.bool(&z, "zero_masked_rows")?,
                    None => false,
                };
                Op::AttentionGrad {
                    wrt: attrs.wrt(&w)?,
                    scale: attrs.f64(&v, "scale")?,
                    causal: attrs.bool(&c, "causal")?,
                    zero_masked_rows: z,
                }
            }
            OpKind::BatchNorm => {
                let e = attrs.required("epsilon")?;
                let m = attrs.required("momentum")?;
                Op::BatchNorm {
                    epsilon: attrs.f64(&e, "epsilon")?,
                    momentum: attrs.f64(&m, "momentum")?,
                }
            }
            OpKind::Conv => {
                let window = attrs.window()?;
                let g = attrs.required("groups")?;
                Op::Conv {
                    window,
                    groups: attrs.usize(&g, "groups")?,
                }
            }
            OpKind::ConvGrad => {
                let w = attrs.required("wrt")?;
                let wrt = match &w.kind {
                    ValKind::Ident(s) if s == "input" => crate::ConvOperand::Input,
                    ValKind::Ident(s) if s == "weight" => crate::ConvOperand::Weight,
                    _ => return Err(attrs.bad(&w, "wrt", "`input` or `weight`")),
                };
                let window = attrs.window()?;
                let g = attrs.required("groups")?;
                let sh = attrs.required("shape")?;
                Op::ConvGrad {
                    wrt,
                    window,
                    groups: attrs.usize(&g, "groups")?,
                    shape: attrs.shape(&sh, "shape")?,
                }
            }
            OpKind::Pool(op) | OpKind::PoolGrad(op) => {
                let k = attrs.required("kernel")?;
                let kernel = attrs.usizes(&k, "kernel")?;
                let window = attrs.window()?;
                let c = attrs.required("ceil_mode")?;
                let p = attrs.required("count_include_pad")?;
                let (ceil_mode, count_include_pad) =
                    (attrs.bool(&c, "ceil_mode")?, attrs.bool(&p, "count_include_pad")?);
                if matches!(kind, OpKind::Pool(_)) {
                    Op::Pool {
                        op,
                        kernel,
                        window,
                        ceil_mode,
                        count_include_pad,
                    }
                } else {
                    Op::PoolGrad {
                        op,
                        kernel,
                        window,
                        ceil_mode,
                        count_include_pad,
                    }
                }
            }
            OpKind::Dequantize => {
                let b = attrs.required("bits")?;
                let g = attrs.required("group")?;
                Op::Dequantize {
                    bits: attrs.usize(&b, "bits")?,
                    group: attrs.usize(&g, "group")?,
                }
            }
        })
    }

    pub(super) fn take(&mut self, key: &str) -> Option<Val> {
        let i = self.list.iter().position(|(k, _, _)| k == key)?;
        Some(self.list.remove(i).2)
    }

    fn required(&mut self, key: &str) -> Result<Val, ParseError> {
        self.take(key)
            .ok_or_else(|| self.op_pos.err(format!("{} needs the attribute `{key}`", self.op)))
    }

    pub(super) fn finish(&self) -> Result<(), ParseError> {
        match self.list.first() {
            Some((k, p, _)) => Err(p.err(format!("unknown attribute `{}` for {}", snippet(k), self.op))),
            None => Ok(()),
        }
    }

    pub(super) fn text(&self, v: &Val) -> String {
        snippet(self.src.get(v.start..v.end).unwrap_or(""))
    }

    pub(super) fn bad(&self, v: &Val, key: &str, expected: &str) -> ParseError {
        v.pos.err(format!(
            "attribute `{key}` expects {expected}, found `{}`",
            self.text(v)
        ))
    }

    pub(super) fn string(&self, v: &Val, key: &str) -> Result<String, ParseError> {
        match &v.kind {
            ValKind::Str(s) => Ok(s.clone()),
            _ => Err(self.bad(v, key, "a string")),
        }
    }

    pub(super) fn usize(&self, v: &Val, key: &str) -> Result<usize, ParseError> {
        match &v.kind {
            ValKind::Int(s) if !s.starts_with('-') => s
                .parse::<usize>()
                .map_err(|_| self.bad(v, key, "a non-negative integer")),
            _ => Err(self.bad(v, key, "a non-negative integer")),
        }
    }

    pub(super) fn list<'v>(&self, v: &'v Val, key: &str, expected: &str) -> Result<&'v [Val], ParseError> {
        match &v.kind {
            ValKind::List(items) => Ok(items),
            _ => Err(self.bad(v, key, expected)),
        }
    }

    fn usizes(&self, v: &Val, key: &str) -> Result<Vec<usize>, ParseError> {
        let items = self.list(v, key, "a list of non-negative integers like `[0,1]`")?;
        items.iter().map(|x| self.usize(x, key)).collect()
    }

    fn shape(&self, v: &Val, key: &str) -> Result<Shape, ParseError> {
        let dims = self.usizes(v, key)?;
        check_dims(&dims).map_err(|m| v.pos.err(m))?;
        Ok(Shape(dims))
    }

    pub(super) fn bool(&self, v: &Val, key: &str) -> Result<bool, ParseError> {
        match &v.kind {
            ValKind::Ident(s) if s == "true" => Ok(true),
            ValKind::Ident(s) if s == "false" => Ok(false),
            _ => Err(self.bad(v, key, "`true` or `false`")),
        }
    }

    fn dtype(&self, v: &Val, key: &str) -> Result<DType, ParseError> {
        match &v.kind {
            ValKind::Ident(s) => s.parse::<DType>().map_err(|_| self.bad(v, key, "a dtype")),
            _ => Err(self.bad(v, key, "a dtype")),
        }
    }

    fn wrt(&self, v: &Val) -> Result<crate::op::AttentionOperand, ParseError> {
        use crate::op::AttentionOperand as A;
        match &v.kind {
            ValKind::Ident(s) if s == "q" => Ok(A::Q),
            ValKind::Ident(s) if s == "k" => Ok(A::K),
            ValKind::Ident(s) if s == "v" => Ok(A::V),
            _ => Err(self.bad(v, "wrt", "`q`, `k` or `v`")),
        }
    }

    fn mode(&self, v: &Val) -> Result<PadMode, ParseError> {
        match &v.kind {
            ValKind::Ident(s) if s == "constant" => Ok(PadMode::Constant),
            ValKind::Ident(s) if s == "reflect" => Ok(PadMode::Reflect),
            ValKind::Ident(s) if s == "edge" => Ok(PadMode::Edge),
            _ => Err(self.bad(v, "mode", "`constant`, `reflect` or `edge`")),
        }
    }

    pub(super) fn i64(&self, v: &Val, key: &str) -> Result<i64, ParseError> {
        match &v.kind {
            ValKind::Int(s) => s
                .parse::<i64>()
                .map_err(|_| self.bad(v, key, "an integer in the i64 range")),
            ValKind::Ident(s) if s == "max" => Ok(i64::MAX),
            ValKind::Ident(s) if s == "min" => Ok(i64::MIN),
            _ => Err(self.bad(v, key, "an integer")),
        }
    }

    fn ranges(&self, v: &Val) -> Result<Vec<SliceRange>, ParseError> {
        let items = self.list(v, "ranges", "a list of `start:end:step` like `[0:8:1]`")?;
        items
            .iter()
            .map(|r| match &r.kind {
                ValKind::Range(b) => {
                    let [start, end, step] = &**b;
                    Ok(SliceRange {
                        start: self.i64(start, "ranges")?,
                        end: self.i64(end, "ranges")?,
                        step: self.i64(step, "ranges")?,
                    })
                }
                _ => Err(self.bad(r, "ranges", "a range `start:end:step`")),
            })
            .collect()
    }

    /// A window's `strides`, `pads` (non-negative pairs) and `dilations`.
    fn window(&mut self) -> Result<crate::Window, ParseError> {
        let s = self.required("strides")?;
        let p = self.required("pads")?;
        let d = self.required("dilations")?;
        let pads = self
            .pads(&p)?
            .into_iter()
            .map(|(lo, hi)| Some((usize::try_from(lo).ok()?, usize::try_from(hi).ok()?)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.bad(&p, "pads", "non-negative pairs"))?;
        Ok(crate::Window {
            strides: self.usizes(&s, "strides")?,
            pads,
            dilations: self.usizes(&d, "dilations")?,
        })
    }

    fn pads(&self, v: &Val) -> Result<Vec<(i64, i64)>, ParseError> {
        let items = self.list(v, "pads", "a list of pairs like `[(1,2),(0,0)]`")?;
        items
            .iter()
            .map(|p| match &p.kind {
                ValKind::Tuple(xs) => match &xs[..] {
                    [lo, hi] => Ok((self.i64(lo, "pads")?, self.i64(hi, "pads")?)),
                    _ => Err(self.bad(p, "pads", "a pair `(before,after)`")),
                },
                _ => Err(self.bad(p, "pads", "a pair `(before,after)`")),
            })
            .collect()
    }
}
