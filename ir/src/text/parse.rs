//! The parser: tokens to a verified graph.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::attrs::Attrs;
use super::lex::{err, lex, snippet, Tok, Token};
use super::ParseError;
use crate::op::OpKind;
use crate::work::{self, Stage};
use crate::{DType, Graph, GraphError, Node, NodeId, Op, Shape, TensorType};

/// Deepest nesting of brackets in attribute values.
const MAX_DEPTH: usize = 32;

/// A place in the source.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pos {
    pub(super) line: usize,
    pub(super) col: usize,
}

impl Pos {
    pub(super) fn err(self, message: impl Into<String>) -> ParseError {
        err(self.line, self.col, message)
    }
}

/// An attribute value, untyped, with its place and source text.
#[derive(Clone, Debug)]
pub(super) struct Val {
    pub(super) kind: ValKind,
    pub(super) pos: Pos,
    pub(super) start: usize,
    pub(super) end: usize,
}

#[derive(Clone, Debug)]
pub(super) enum ValKind {
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
        work::add(Stage::Parse, 1);
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
        let kind =
            OpKind::from_name(&op_name).ok_or_else(|| op_pos.err(format!("unknown op `{}`", snippet(&op_name))))?;
        let binding = matches!(kind, OpKind::Input | OpKind::Parameter);
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
            OpKind::Input | OpKind::Parameter => {
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
                    work::add(Stage::Parse, 1);
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
pub(super) fn check_dims(dims: &[usize]) -> Result<(), String> {
    let shape = Shape::new(dims.to_vec());
    match shape.checked_numel() {
        Some(_) => Ok(()),
        None => Err(format!("shape {shape} is too large")),
    }
}

/// Turn the parsed definitions into a graph, resolving ids, and check it.
///
/// A reference resolves only to a node defined on an earlier line, so the node table
/// is in definition order and topological, and no cycle can be written.
fn build(defs: Vec<NodeDef>, outputs: Vec<OutputDef>, graph_pos: Pos) -> Result<Graph, ParseError> {
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(defs.len());
    // Each loop below visits every definition (and its operands) once.
    work::add_len(Stage::Parse, 4 * defs.len() + outputs.len());
    work::add_len(Stage::Parse, defs.iter().map(|d| d.inputs.len()).sum::<usize>());
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
