//! The parser: tokens to a verified graph.

use half::{bf16, f16};
use std::collections::{BTreeMap, HashMap, HashSet};

use super::lex::{err, lex, snippet, Tok, Token};
use super::print::{BF16_NAN, F16_NAN, F32_NAN, F64_NAN};
use super::ParseError;
use crate::{
    ArgReduceOp, BinaryOp, DType, Graph, GraphError, Node, NodeId, Op, PadMode, ReduceOp, Shape, SliceRange, Tensor,
    TensorData, TensorType, UnaryOp,
};

/// Largest element count of a type (zero dims counted as one) the parser accepts.
/// Deepest nesting of brackets in attribute values.
const MAX_DEPTH: usize = 32;

/// A place in the source.
#[derive(Clone, Copy, Debug)]
struct Pos {
    line: usize,
    col: usize,
}

impl Pos {
    fn err(self, message: impl Into<String>) -> ParseError {
        err(self.line, self.col, message)
    }
}

/// An attribute value, untyped, with its place and source text.
#[derive(Clone, Debug)]
struct Val {
    kind: ValKind,
    pos: Pos,
    start: usize,
    end: usize,
}

#[derive(Clone, Debug)]
enum ValKind {
    Int(String),
    Float(String),
    Ident(String),
    /// `-` followed by an identifier: `-inf`, `-nan`.
    NegIdent(String),
    /// `nan(0x..)`.
    NanBits(String),
    Str(String),
    List(Vec<Val>),
    Tuple(Vec<Val>),
    Range(Box<[Val; 3]>),
}

struct NodeDef {
    id: u64,
    id_pos: Pos,
    op_pos: Pos,
    op: Op,
    inputs: Vec<(u64, Pos)>,
    ty: TensorType,
    ty_pos: Pos,
    name: Option<String>,
    /// Where the binding name of an input/param is.
    binding_pos: Pos,
}

/// `output NAME = %ID`: the name and its place, the id and its place, and how many
/// definitions precede the line.
type OutputDef = (String, Pos, u64, Pos, usize);

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    i: usize,
}

/// Parse text form into a verified graph and the weights file its `weights` line names.
pub fn parse_module(src: &str) -> Result<(Graph, Option<String>), ParseError> {
    let toks = lex(src)?;
    let mut p = Parser { src, toks, i: 0 };
    p.module()
}

impl Parser<'_> {
    // The token list always ends with Eof (`lex` pushes it last), and `bump` never
    // moves past it, so the index is in bounds.
    #[allow(clippy::indexing_slicing)]
    fn peek(&self) -> &Token {
        &self.toks[self.i.min(self.toks.len().saturating_sub(1))]
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn pos(&self) -> Pos {
        let t = self.peek();
        Pos {
            line: t.line,
            col: t.col,
        }
    }

    /// How the next token reads in a message.
    fn found(&self) -> String {
        let t = self.peek();
        match t.tok {
            Tok::Eof => "end of input".to_string(),
            _ => format!("`{}`", snippet(&self.src[t.start..t.end])),
        }
    }

    fn error(&self, expected: &str) -> ParseError {
        self.pos().err(format!("expected {expected}, found {}", self.found()))
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    fn expect_punct(&mut self, c: char, what: &str) -> Result<Pos, ParseError> {
        if self.is_punct(c) {
            let p = self.pos();
            self.bump();
            Ok(p)
        } else {
            Err(self.error(&format!("`{c}` {what}")))
        }
    }

    fn is_ident(&self, s: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(x) if x == s)
    }

    fn expect_string(&mut self, what: &str) -> Result<(String, Pos), ParseError> {
        let p = self.pos();
        match &self.peek().tok {
            Tok::Str(s) => {
                let s = s.clone();
                self.bump();
                Ok((s, p))
            }
            _ => Err(self.error(what)),
        }
    }

    fn expect_ref(&mut self, what: &str) -> Result<(u64, Pos), ParseError> {
        let p = self.pos();
        match self.peek().tok {
            Tok::Ref(n) => {
                self.bump();
                Ok((n, p))
            }
            _ => Err(self.error(what)),
        }
    }

    fn module(&mut self) -> Result<(Graph, Option<String>), ParseError> {
        if !self.is_ident("graph") {
            return Err(self.error("`graph`"));
        }
        let graph_pos = self.pos();
        self.bump();
        self.expect_punct('{', "after `graph`")?;
        let mut weights: Option<(String, Pos)> = None;
        let mut defs: Vec<NodeDef> = Vec::new();
        let mut outputs: Vec<OutputDef> = Vec::new();
        loop {
            let p = self.pos();
            match &self.peek().tok {
                Tok::Punct('}') => {
                    self.bump();
                    break;
                }
                Tok::Ident(w) if w == "weights" => {
                    self.bump();
                    let (file, _) = self.expect_string("the weights file name as a string")?;
                    if let Some((_, first)) = &weights {
                        return Err(p.err(format!("a second `weights` line (the first is at line {})", first.line)));
                    }
                    weights = Some((file, p));
                }
                Tok::Ident(w) if w == "output" => {
                    self.bump();
                    let (name, name_pos) = self.expect_string("the output name as a string")?;
                    self.expect_punct('=', "after the output name")?;
                    let (id, id_pos) = self.expect_ref("a node id like `%3`")?;
                    outputs.push((name, name_pos, id, id_pos, defs.len()));
                }
                Tok::Ref(_) => defs.push(self.node_def()?),
                Tok::Eof => return Err(self.pos().err("missing `}` at the end of the graph")),
                _ => return Err(self.error("a node definition `%N = ...`, `output` or `}`")),
            }
        }
        if !matches!(self.peek().tok, Tok::Eof) {
            return Err(self.error("end of input after the graph's `}`"));
        }
        let graph = build(defs, outputs, graph_pos)?;
        Ok((graph, weights.map(|(f, _)| f)))
    }

    fn node_def(&mut self) -> Result<NodeDef, ParseError> {
        let (id, id_pos) = self.expect_ref("a node id")?;
        self.expect_punct('=', "after the node id")?;
        let op_pos = self.pos();
        let op_name = match &self.peek().tok {
            Tok::Ident(s) => s.clone(),
            _ => return Err(self.error("an op name")),
        };
        self.bump();
        let kind = op_kind(&op_name).ok_or_else(|| op_pos.err(format!("unknown op `{}`", snippet(&op_name))))?;
        let binding = matches!(kind, OpKind::Input | OpKind::Param);
        let mut name = None;
        let mut binding_pos = op_pos;
        if let Tok::Str(s) = &self.peek().tok {
            name = Some(s.clone());
            binding_pos = self.pos();
            self.bump();
        } else if binding {
            return Err(self.error(&format!("the {op_name}'s name as a string, e.g. `{op_name} \"x\"`")));
        }
        let inputs = self.operands()?;
        let attrs = self.attr_list()?;
        self.expect_punct(':', "before the type")?;
        let ty_pos = self.pos();
        let ty = self.ty()?;

        let mut attrs = Attrs {
            src: self.src,
            op: &op_name,
            op_pos,
            list: attrs,
        };
        let mut node_name = if binding { None } else { name.clone() };
        let op = match kind {
            OpKind::Input | OpKind::Param => {
                if let Some(v) = attrs.take("name") {
                    node_name = Some(attrs.string(&v, "name")?);
                }
                let name = name.unwrap_or_default();
                if kind == OpKind::Input {
                    Op::Input { name, ty: ty.clone() }
                } else {
                    Op::Parameter { name, ty: ty.clone() }
                }
            }
            _ => attrs.op(kind, &ty)?,
        };
        attrs.finish()?;
        if let Some(n) = op.arity() {
            if inputs.len() != n {
                return Err(op_pos.err(format!("{op_name} takes {n} operand(s), got {}", inputs.len())));
            }
        } else if inputs.is_empty() {
            return Err(op_pos.err(format!("{op_name} takes at least one operand")));
        }
        Ok(NodeDef {
            id,
            id_pos,
            op_pos,
            op,
            inputs,
            ty,
            ty_pos,
            name: node_name,
            binding_pos,
        })
    }

    /// `(%a, %b, ...)`, if present.
    fn operands(&mut self) -> Result<Vec<(u64, Pos)>, ParseError> {
        let mut inputs = Vec::new();
        if self.is_punct('(') {
            self.bump();
            if !self.is_punct(')') {
                loop {
                    inputs.push(self.expect_ref("an operand like `%3`")?);
                    if self.is_punct(',') {
                        self.bump();
                    } else {
                        break;
                    }
                }
            }
            self.expect_punct(')', "after the operands")?;
        }
        Ok(inputs)
    }

    /// `{key=value, ...}`, if present; a key given twice is an error.
    fn attr_list(&mut self) -> Result<Vec<(String, Pos, Val)>, ParseError> {
        let mut attrs: Vec<(String, Pos, Val)> = Vec::new();
        // Keys seen so far: a set, so that many attributes cost linear time.
        let mut keys: HashSet<String> = HashSet::new();
        if self.is_punct('{') {
            self.bump();
            if !self.is_punct('}') {
                loop {
                    let apos = self.pos();
                    let key = match &self.peek().tok {
                        Tok::Ident(s) => s.clone(),
                        _ => return Err(self.error("an attribute name")),
                    };
                    self.bump();
                    if !keys.insert(key.clone()) {
                        return Err(apos.err(format!("attribute `{}` is given twice", snippet(&key))));
                    }
                    if !self.is_punct('=') {
                        return Err(self.error(&format!("`=` after the attribute name `{}`", snippet(&key))));
                    }
                    self.bump();
                    let v = self.value(0)?;
                    attrs.push((key, apos, v));
                    if self.is_punct(',') {
                        self.bump();
                    } else {
                        break;
                    }
                }
            }
            self.expect_punct('}', "after the attributes")?;
        }
        Ok(attrs)
    }

    fn ty(&mut self) -> Result<TensorType, ParseError> {
        let p = self.pos();
        let dtype = match &self.peek().tok {
            Tok::Ident(s) => s
                .parse::<DType>()
                .map_err(|_| p.err(format!("unknown dtype `{}` in the type", snippet(s))))?,
            _ => return Err(self.error("a type like `f32[2,3]`")),
        };
        self.bump();
        self.expect_punct('[', "after the dtype (a scalar is `f32[]`)")?;
        let mut dims = Vec::new();
        if !self.is_punct(']') {
            loop {
                let dp = self.pos();
                match &self.peek().tok {
                    Tok::Int(s) if !s.starts_with(['-', '+']) => {
                        let d = s
                            .parse::<usize>()
                            .map_err(|_| dp.err(format!("dimension `{}` is too large", snippet(s))))?;
                        dims.push(d);
                        self.bump();
                    }
                    _ => return Err(self.error("a dimension (a non-negative integer)")),
                }
                if self.is_punct(',') {
                    self.bump();
                } else {
                    break;
                }
            }
        }
        self.expect_punct(']', "after the dimensions")?;
        check_dims(&dims).map_err(|m| p.err(m))?;
        Ok(TensorType::new(dtype, dims))
    }

    fn value(&mut self, depth: usize) -> Result<Val, ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.pos().err("attribute value nested too deeply"));
        }
        let t = self.peek().clone();
        let pos = Pos {
            line: t.line,
            col: t.col,
        };
        let mk = |kind, end| Val {
            kind,
            pos,
            start: t.start,
            end,
        };
        let v = match &t.tok {
            Tok::Int(s) => {
                self.bump();
                mk(ValKind::Int(s.clone()), t.end)
            }
            Tok::Float(s) => {
                self.bump();
                mk(ValKind::Float(s.clone()), t.end)
            }
            Tok::Str(s) => {
                self.bump();
                mk(ValKind::Str(s.clone()), t.end)
            }
            Tok::Minus => {
                self.bump();
                match &self.peek().tok {
                    Tok::Ident(s) => {
                        let s = s.clone();
                        let end = self.peek().end;
                        self.bump();
                        mk(ValKind::NegIdent(s), end)
                    }
                    _ => return Err(self.error("`inf` or `nan` after `-`")),
                }
            }
            Tok::Ident(s) => {
                self.bump();
                if s == "nan" && self.is_punct('(') {
                    self.bump();
                    let bits = match &self.peek().tok {
                        Tok::Hex(h) => h.clone(),
                        _ => return Err(self.error("hex NaN bits like `0x7fc00001`")),
                    };
                    self.bump();
                    let end = self.peek().end;
                    self.expect_punct(')', "after the NaN bits")?;
                    mk(ValKind::NanBits(bits), end)
                } else {
                    mk(ValKind::Ident(s.clone()), t.end)
                }
            }
            Tok::Punct(open @ ('[' | '(')) => {
                let close = if *open == '[' { ']' } else { ')' };
                self.bump();
                let mut items = Vec::new();
                if !self.is_punct(close) {
                    loop {
                        items.push(self.value(depth + 1)?);
                        if self.is_punct(',') {
                            self.bump();
                        } else {
                            break;
                        }
                    }
                }
                let end = self.peek().end;
                self.expect_punct(close, "to close the list")?;
                if close == ']' {
                    mk(ValKind::List(items), end)
                } else {
                    mk(ValKind::Tuple(items), end)
                }
            }
            _ => return Err(self.error("an attribute value")),
        };
        if self.is_punct(':') && matches!(v.kind, ValKind::Int(_) | ValKind::Ident(_)) {
            self.bump();
            let end = self.bound_val()?;
            self.expect_punct(':', "before the slice step")?;
            let step = self.bound_val()?;
            let (start, stop) = (v.start, step.end);
            return Ok(Val {
                kind: ValKind::Range(Box::new([v, end, step])),
                pos,
                start,
                end: stop,
            });
        }
        Ok(v)
    }

    fn bound_val(&mut self) -> Result<Val, ParseError> {
        let t = self.peek().clone();
        let kind = match &t.tok {
            Tok::Int(s) => ValKind::Int(s.clone()),
            Tok::Ident(s) => ValKind::Ident(s.clone()),
            _ => return Err(self.error("a slice bound (an integer, `max` or `min`)")),
        };
        self.bump();
        Ok(Val {
            kind,
            pos: Pos {
                line: t.line,
                col: t.col,
            },
            start: t.start,
            end: t.end,
        })
    }
}

/// Check a shape's element count stays far from overflow.
fn check_dims(dims: &[usize]) -> Result<(), String> {
    let shape = Shape::new(dims.to_vec());
    match shape.checked_numel() {
        Some(_) => Ok(()),
        None => Err(format!("shape {shape} is too large")),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum OpKind {
    Input,
    Param,
    Constant,
    Iota,
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast,
    Broadcast,
    Reduce(ReduceOp),
    ArgReduce(ArgReduceOp),
    MatMul,
    Reshape,
    Transpose,
    Slice,
    Concat,
    Gather,
    Pad,
}

fn op_kind(name: &str) -> Option<OpKind> {
    Some(match name {
        "input" => OpKind::Input,
        "param" => OpKind::Param,
        "constant" => OpKind::Constant,
        "iota" => OpKind::Iota,
        "select" => OpKind::Select,
        "cast" => OpKind::Cast,
        "broadcast" => OpKind::Broadcast,
        "matmul" => OpKind::MatMul,
        "reshape" => OpKind::Reshape,
        "transpose" => OpKind::Transpose,
        "slice" => OpKind::Slice,
        "concat" => OpKind::Concat,
        "gather" => OpKind::Gather,
        "pad" => OpKind::Pad,
        "argmax" => OpKind::ArgReduce(ArgReduceOp::ArgMax),
        "argmin" => OpKind::ArgReduce(ArgReduceOp::ArgMin),
        _ => {
            if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == name) {
                OpKind::Unary(u)
            } else if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == name) {
                OpKind::Binary(b)
            } else {
                OpKind::Reduce(ReduceOp::ALL.into_iter().find(|r| r.name() == name)?)
            }
        }
    })
}

/// The attributes of one node, taken one by one as the op needs them.
struct Attrs<'a> {
    src: &'a str,
    op: &'a str,
    op_pos: Pos,
    list: Vec<(String, Pos, Val)>,
}

impl Attrs<'_> {
    /// The op of a node of kind `kind` (not an input or parameter) and type `ty`, its
    /// attributes taken from the list.
    fn op(&mut self, kind: OpKind, ty: &TensorType) -> Result<Op, ParseError> {
        let attrs = self;
        Ok(match kind {
            OpKind::Input | OpKind::Param => {
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
        })
    }

    fn take(&mut self, key: &str) -> Option<Val> {
        let i = self.list.iter().position(|(k, _, _)| k == key)?;
        Some(self.list.remove(i).2)
    }

    fn required(&mut self, key: &str) -> Result<Val, ParseError> {
        self.take(key)
            .ok_or_else(|| self.op_pos.err(format!("{} needs the attribute `{key}`", self.op)))
    }

    fn finish(&self) -> Result<(), ParseError> {
        match self.list.first() {
            Some((k, p, _)) => Err(p.err(format!("unknown attribute `{}` for {}", snippet(k), self.op))),
            None => Ok(()),
        }
    }

    fn text(&self, v: &Val) -> String {
        snippet(self.src.get(v.start..v.end).unwrap_or(""))
    }

    fn bad(&self, v: &Val, key: &str, expected: &str) -> ParseError {
        v.pos.err(format!(
            "attribute `{key}` expects {expected}, found `{}`",
            self.text(v)
        ))
    }

    fn string(&self, v: &Val, key: &str) -> Result<String, ParseError> {
        match &v.kind {
            ValKind::Str(s) => Ok(s.clone()),
            _ => Err(self.bad(v, key, "a string")),
        }
    }

    fn usize(&self, v: &Val, key: &str) -> Result<usize, ParseError> {
        match &v.kind {
            ValKind::Int(s) if !s.starts_with('-') => s
                .parse::<usize>()
                .map_err(|_| self.bad(v, key, "a non-negative integer")),
            _ => Err(self.bad(v, key, "a non-negative integer")),
        }
    }

    fn list<'v>(&self, v: &'v Val, key: &str, expected: &str) -> Result<&'v [Val], ParseError> {
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

    fn bool(&self, v: &Val, key: &str) -> Result<bool, ParseError> {
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

    fn mode(&self, v: &Val) -> Result<PadMode, ParseError> {
        match &v.kind {
            ValKind::Ident(s) if s == "constant" => Ok(PadMode::Constant),
            ValKind::Ident(s) if s == "reflect" => Ok(PadMode::Reflect),
            ValKind::Ident(s) if s == "edge" => Ok(PadMode::Edge),
            _ => Err(self.bad(v, "mode", "`constant`, `reflect` or `edge`")),
        }
    }

    fn i64(&self, v: &Val, key: &str) -> Result<i64, ParseError> {
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

    fn f64(&self, v: &Val, key: &str) -> Result<f64, ParseError> {
        match float_lit(v)? {
            FloatLit::Num(s) => s.parse::<f64>().map_err(|_| self.bad(v, key, "a number")),
            FloatLit::Inf(neg) => Ok(if neg { f64::NEG_INFINITY } else { f64::INFINITY }),
            FloatLit::Nan(neg) => Ok(f64::from_bits(F64_NAN | if neg { 1 << 63 } else { 0 })),
            FloatLit::NanBits(bits) => nan_bits(v, bits, 64, 11).map(f64::from_bits),
            FloatLit::Other => Err(self.bad(v, key, "a number")),
        }
    }

    /// A constant's elements, flat, for a tensor of type `ty`.
    fn tensor(&self, v: &Val, ty: &TensorType) -> Result<Tensor, ParseError> {
        let items = self.list(v, "value", "a flat list of elements like `[1.0, 2.0]`")?;
        if items.len() != ty.numel() {
            return Err(v.pos.err(format!(
                "constant has {} element(s) but its type {ty} has {}",
                items.len(),
                ty.numel()
            )));
        }
        let dt = ty.dtype;
        let data = match dt {
            DType::F32 => TensorData::F32(self.each(items, |x| {
                self.float(x, dt, F32_NAN, (32, 8), |b| f32::from_bits(b as u32))
            })?),
            DType::F64 => TensorData::F64(self.each(items, |x| self.f64(x, "value"))?),
            DType::F16 => TensorData::F16(self.each(items, |x| {
                self.float(x, dt, F16_NAN, (16, 5), |b| f16::from_bits(b as u16))
                    .map(|h: Half<f16>| h.0)
            })?),
            DType::BF16 => TensorData::BF16(self.each(items, |x| {
                self.float(x, dt, BF16_NAN, (16, 8), |b| bf16::from_bits(b as u16))
                    .map(|h: Half<bf16>| h.0)
            })?),
            DType::I64 => TensorData::I64(self.each(items, |x| self.int(x, dt))?),
            DType::I32 => TensorData::I32(self.each(items, |x| self.int(x, dt))?),
            DType::I8 => TensorData::I8(self.each(items, |x| self.int(x, dt))?),
            DType::U8 => TensorData::U8(self.each(items, |x| self.int(x, dt))?),
            DType::Bool => TensorData::Bool(self.each(items, |x| self.bool(x, "value"))?),
        };
        Tensor::new(ty.shape.clone(), data).map_err(|e| v.pos.err(e.to_string()))
    }

    fn each<T>(&self, items: &[Val], f: impl Fn(&Val) -> Result<T, ParseError>) -> Result<Vec<T>, ParseError> {
        items.iter().map(f).collect()
    }

    fn int<T: TryFrom<i128>>(&self, v: &Val, dt: DType) -> Result<T, ParseError> {
        match &v.kind {
            ValKind::Int(s) => s
                .parse::<i128>()
                .ok()
                .and_then(|x| T::try_from(x).ok())
                .ok_or_else(|| v.pos.err(format!("`{}` is out of range for {dt}", self.text(v)))),
            _ => Err(self.bad(v, "value", &format!("an integer ({dt} element)"))),
        }
    }

    /// A float element of dtype `dt` (f32, f16 or bf16): numbers parse as f32 and
    /// convert; NaNs are built from bits `width` wide with `exp` exponent bits.
    fn float<T: FromF32>(
        &self,
        v: &Val,
        dt: DType,
        canonical_nan: u64,
        (width, exp): (u32, u32),
        from_bits: impl Fn(u64) -> T::Raw,
    ) -> Result<T, ParseError> {
        match float_lit(v)? {
            FloatLit::Num(s) => s
                .parse::<f32>()
                .map(T::from_f32)
                .map_err(|_| self.bad(v, "value", &format!("a number ({dt} element)"))),
            FloatLit::Inf(neg) => Ok(T::from_f32(if neg { f32::NEG_INFINITY } else { f32::INFINITY })),
            FloatLit::Nan(neg) => Ok(T::from_raw(from_bits(
                canonical_nan | if neg { 1 << (width - 1) } else { 0 },
            ))),
            FloatLit::NanBits(bits) => nan_bits(v, bits, width, exp).map(|b| T::from_raw(from_bits(b))),
            FloatLit::Other => Err(self.bad(v, "value", &format!("a number ({dt} element)"))),
        }
    }
}

/// Element types a float literal converts to.
trait FromF32: Sized {
    type Raw;
    fn from_f32(x: f32) -> Self;
    fn from_raw(r: Self::Raw) -> Self;
}

impl FromF32 for f32 {
    type Raw = f32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn from_raw(r: f32) -> f32 {
        r
    }
}

struct Half<T>(T);

impl FromF32 for Half<f16> {
    type Raw = f16;
    fn from_f32(x: f32) -> Self {
        Half(f16::from_f32(x))
    }
    fn from_raw(r: f16) -> Self {
        Half(r)
    }
}

impl FromF32 for Half<bf16> {
    type Raw = bf16;
    fn from_f32(x: f32) -> Self {
        Half(bf16::from_f32(x))
    }
    fn from_raw(r: bf16) -> Self {
        Half(r)
    }
}

enum FloatLit<'v> {
    Num(&'v str),
    Inf(bool),
    Nan(bool),
    NanBits(&'v str),
    Other,
}

fn float_lit(v: &Val) -> Result<FloatLit<'_>, ParseError> {
    Ok(match &v.kind {
        ValKind::Int(s) | ValKind::Float(s) => FloatLit::Num(s),
        ValKind::Ident(s) if s == "inf" => FloatLit::Inf(false),
        ValKind::NegIdent(s) if s == "inf" => FloatLit::Inf(true),
        ValKind::Ident(s) if s == "nan" => FloatLit::Nan(false),
        ValKind::NegIdent(s) if s == "nan" => FloatLit::Nan(true),
        ValKind::NanBits(b) => FloatLit::NanBits(b),
        _ => FloatLit::Other,
    })
}

/// NaN bits of a float `width` bits wide with `exp` exponent bits; they must fit and
/// be a NaN.
fn nan_bits(v: &Val, hex: &str, width: u32, exp: u32) -> Result<u64, ParseError> {
    let mant = width - 1 - exp;
    let is_nan = |b: u64| {
        let e = (b >> mant) & ((1u64 << exp) - 1);
        let m = b & ((1u64 << mant) - 1);
        (width == 64 || b >> width == 0) && e == (1u64 << exp) - 1 && m != 0
    };
    match u64::from_str_radix(hex, 16) {
        Ok(b) if is_nan(b) => Ok(b),
        _ => Err(v.pos.err(format!("`nan(0x{})` is not a {width}-bit NaN", snippet(hex)))),
    }
}

/// Turn the parsed definitions into a graph, resolving ids, and check it.
///
/// A reference resolves only to a node defined on an earlier line, so the node table
/// is in definition order and topological, and no cycle can be written.
fn build(defs: Vec<NodeDef>, outputs: Vec<OutputDef>, graph_pos: Pos) -> Result<Graph, ParseError> {
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(defs.len());
    for (i, d) in defs.iter().enumerate() {
        if let Some(first) = index.get(&d.id).and_then(|&f| defs.get(f)) {
            return Err(d.id_pos.err(format!(
                "node %{} is defined twice (first at line {})",
                d.id, first.id_pos.line
            )));
        }
        index.insert(d.id, i);
    }
    if defs.len() > u32::MAX as usize {
        return Err(graph_pos.err("too many nodes"));
    }
    // `id` used at `pos`, after the first `before` definitions; `own`: by the definition
    // at that index itself.
    let resolve = |id: u64, pos: Pos, before: usize, own: bool| match index.get(&id) {
        None => Err(pos.err(format!("undefined node %{id}"))),
        Some(&i) if i < before => Ok(NodeId(i as u32)),
        Some(&i) => {
            let at = defs.get(i).map_or(pos, |d| d.id_pos);
            Err(pos.err(if own && i == before {
                format!("node %{id} is used in its own definition (a value must be defined before it is used)")
            } else {
                format!(
                    "node %{id} is used before its definition at {}:{} (a value must be defined before it is used)",
                    at.line, at.col
                )
            }))
        }
    };
    let mut g = Graph::new();
    for (u, d) in defs.iter().enumerate() {
        let inputs = d
            .inputs
            .iter()
            .map(|&(id, pos)| resolve(id, pos, u, true))
            .collect::<Result<Vec<_>, _>>()?;
        g.push(Node {
            op: d.op.clone(),
            inputs,
            ty: d.ty.clone(),
            name: d.name.clone(),
        });
    }
    let mut output_names: BTreeMap<&str, Pos> = BTreeMap::new();
    for (name, name_pos, id, id_pos, before) in &outputs {
        if let Some(first) = output_names.insert(name, *name_pos) {
            return Err(name_pos.err(format!(
                "output name \"{}\" is used twice (first at line {})",
                name.escape_debug(),
                first.line
            )));
        }
        g.add_output(name.clone(), resolve(*id, *id_pos, *before, false)?);
    }

    // Types, in table order (operands come first).
    for (id, d) in g.ids().zip(&defs) {
        let node = g.node(id);
        let args: Vec<&TensorType> = node.inputs.iter().map(|&i| &g.node(i).ty).collect();
        let inferred = crate::infer_type(&node.op, &args).map_err(|m| d.op_pos.err(m))?;
        if inferred != d.ty {
            return Err(d.ty_pos.err(format!(
                "declared type {} but {} gives {inferred}",
                d.ty,
                node.op.name()
            )));
        }
    }

    // Bindings: unique input and parameter names.
    let mut names: HashMap<(bool, &str), usize> = HashMap::new();
    for (i, d) in defs.iter().enumerate() {
        let (is_input, name) = match &d.op {
            Op::Input { name, .. } => (true, name),
            Op::Parameter { name, .. } => (false, name),
            _ => continue,
        };
        if let Some(first) = names.get(&(is_input, name.as_str())).and_then(|&f| defs.get(f)) {
            return Err(d.binding_pos.err(format!(
                "{} name \"{}\" is used twice (first at line {})",
                if is_input { "input" } else { "parameter" },
                name.escape_debug(),
                first.id_pos.line
            )));
        }
        names.insert((is_input, name.as_str()), i);
    }
    g.verify().map_err(|e| graph_error(e, &defs, graph_pos))?;
    Ok(g)
}

/// A verifier error, placed at the node it names (the text's own ids in the message).
fn graph_error(e: GraphError, defs: &[NodeDef], graph_pos: Pos) -> ParseError {
    match e {
        GraphError::Node { node, message, .. } => match defs.get(node.index()) {
            Some(d) => d.id_pos.err(format!("node %{} ({}): {message}", d.id, d.op.name())),
            None => graph_pos.err(message),
        },
        GraphError::Graph(m) => graph_pos.err(m),
    }
}
