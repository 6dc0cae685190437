//! The `.gir` text format: print and parse.
//!
//! ```text
//! # comments start with '#', to end of line
//! graph {
//!   weights "transformer_block.safetensors"      # optional; see below
//!   %0 = input "x" : f32[2,16,256]
//!   %1 = param "ln1.weight" : f32[256]
//!   %2 = constant {value=[1e-5]} : f32[]
//!   %3 = reduce_mean(%0) {axes=[2], keepdims=true} : f32[2,16,1]
//!   %4 = broadcast(%3) {shape=[2,16,256]} : f32[2,16,256]
//!   %5 = sub "ln1/center" (%0, %4) : f32[2,16,256]
//!   output "y" = %5
//! }
//! ```
//!
//! ## Grammar
//!
//! ```text
//! module  := 'graph' '{' stmt* '}'                       (nothing but comments after)
//! stmt    := 'weights' STRING                            (at most once)
//!          | 'output' STRING '=' REF
//!          | REF '=' OPNAME [STRING] ['(' [REF {',' REF}] ')'] ['{' [attr {',' attr}] '}'] ':' type
//! attr    := IDENT '=' value
//! type    := DTYPE '[' [UINT {',' UINT}] ']'             (f32[2,3]; a scalar is f32[])
//! REF     := '%' DIGITS                                  (%0, %17, ...)
//! value   := INT | FLOAT | IDENT | '-' IDENT | 'nan' '(' HEX ')' | STRING
//!          | '[' [value {',' value}] ']' | '(' value {',' value} ')' | bound ':' bound ':' bound
//! ```
//!
//! Whitespace (newlines included) only separates tokens; the printer puts one statement
//! on a line. Identifiers are ASCII `[A-Za-z_][A-Za-z0-9_]*`.
//!
//! ## Nodes
//!
//! `%ID = OPNAME ["node name"] [(%a, %b, ...)] [{key=value, ...}] : TYPE`. `OPNAME` is
//! [`Op::name`](crate::Op::name). The optional string after it is the node's
//! [`Node::name`](crate::Node::name), except for `input` and `param`, where it is the
//! required binding name inside [`Op::Input`](crate::Op::Input) /
//! [`Op::Parameter`](crate::Op::Parameter); their node name, when present, is the
//! attribute `name="..."` (`%0 = input "x" {name="tokens"} : i64[8]`).
//!
//! Attributes (all required, no others allowed):
//!
//! | op | attributes |
//! |----|------------|
//! | `input`, `param` | `name="..."` (optional: the node name) |
//! | `constant` | `value=[...]`: the elements, flat, row-major; the shape is the `: TYPE`'s |
//! | `iota` | `axis=N`; its dtype and shape are the `: TYPE`'s |
//! | `cast` | `to=DTYPE` |
//! | `broadcast`, `reshape` | `shape=[..]` |
//! | `reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min`, `reduce_prod` | `axes=[..]`, `keepdims=BOOL` |
//! | `argmax`, `argmin` | `axis=N`, `keepdims=BOOL` |
//! | `transpose` | `perm=[..]` |
//! | `slice` | `ranges=[start:end:step, ...]`, one per dimension; `max`/`min` stand for `i64::MAX`/`i64::MIN` |
//! | `concat`, `gather` | `axis=N` |
//! | `pad` | `pads=[(before,after), ...]`, `mode=constant\|reflect\|edge`, `value=FLOAT` |
//!
//! Every other op (unary, binary, `select`, `matmul`) has no attributes.
//!
//! The type after `:` is always printed; the parser checks it against
//! [`infer_type`](crate::infer_type) and reports a mismatch at the type.
//!
//! ## Literals
//!
//! Numbers round-trip exactly. Floats print with Rust's shortest round-trip formatting
//! (`{:?}`) of the value as f32 (for f32, f16 and bf16 elements) or f64 (for f64 and
//! the pad value), so `1e-5`, `-0.0`, `3.4028235e38`; infinities are `inf` / `-inf`;
//! the default quiet NaN of the dtype is `nan` (`-nan` with the sign bit set) and any
//! other NaN is `nan(0x...)` with its raw bits in the element's own width. A literal of
//! an f16/bf16 element parses as f32 and converts (exact for printed values). Integer
//! elements are decimal integers (full i64 range), bools `true`/`false`. Float elements
//! also accept integer literals.
//!
//! Strings are double-quoted; `"` and `\` are escaped as `\"` and `\\`, newline, tab
//! and carriage return as `\n`, `\t`, `\r`, other control characters as `\u{hex}`.
//! Anything else, any unicode, stands for itself.
//!
//! ## Numbering and order
//!
//! The printer numbers nodes `%0, %1, ...` in [`Graph::canonical_order`]: inputs
//! first in call order, then the nodes the outputs need, then dead nodes. So
//! `print(g) == print(&g.canonicalize())` and `parse(&print(g)) == g.canonicalize()`
//! (weights aside: they are not in the text). Adding a node that nothing existing
//! depends on does not renumber existing nodes that precede it.
//!
//! The parser accepts any non-negative ids, in any order, but **a value must be defined
//! before it is used**: every `%N` reference, an operand or an `output` line, names a
//! node defined earlier in the text. A reference to a node defined later (or in its own
//! line) is an error at the reference naming the value and where it is defined
//! (`3:12: node %2 is used before its definition at 4:3 ...`). This is a choice, not a
//! limitation: it makes every cycle unwritable (a cycle needs a forward reference), so
//! the node table, which is the order of definition, is always topological, and the
//! parser rejects rather than sorts, so the text reads top to bottom as it runs. The
//! printer always writes this order. The input list is the order of the `input`
//! lines. Duplicate ids, undefined references, unknown ops or attributes, bad types and
//! every other mistake are a [`ParseError`] with a 1-based line and column (columns
//! count characters); the parser never panics, and its time and memory are linear in
//! the text (a 1 MB input parses or fails in milliseconds). The parsed graph passes
//! [`Graph::verify`] (the parser runs it last). To keep shape arithmetic from
//! overflowing, the parser rejects types whose element count (zero dims counted as one)
//! exceeds 2^56, and slice steps or pads so large that extent arithmetic overflows i64.
//!
//! ## Weights
//!
//! Parameter data never appears in the text: it lives in a safetensors side file
//! (exact little-endian bytes, mmap-friendly, readable from PyTorch and numpy) named by
//! the optional `weights "file.safetensors"` line, a path relative to the `.gir`'s
//! folder; see [`crate::weights::save_gir`] and [`crate::weights::load_gir`].
//! [`print_with_weights`] writes that line only for graphs that have parameters.
//! Constants, in contrast, are inline in the text; they are small by construction (the
//! builder makes masks and position tables with `iota` and comparisons, not literal
//! tensors).

mod attrs;
mod lex;
mod literal;
mod parse;
mod print;

use crate::Graph;

pub use parse::parse_module;
pub use print::print_with_weights;

/// A parse error with its place in the text (1-based line and column, in characters).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// The graph in text form, canonically numbered, without a `weights` line.
pub fn print(graph: &Graph) -> String {
    print_with_weights(graph, None)
}

/// Parse text form into a verified graph (without weight data; a `weights` line is
/// accepted and ignored, see [`parse_module`]).
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    parse_module(src).map(|(g, _)| g)
}

#[cfg(test)]
mod tests;
