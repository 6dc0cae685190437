//! The `.gir` text format: print and parse.

use crate::Graph;

/// A parse error with its place in the text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// The graph in text form, canonically numbered.
pub fn print(_graph: &Graph) -> String {
    todo!("printer")
}

/// Parse text form into a verified graph.
pub fn parse(_src: &str) -> Result<Graph, ParseError> {
    todo!("parser")
}
