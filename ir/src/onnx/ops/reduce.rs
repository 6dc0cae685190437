//! reduce ops.

use super::Lowering;

pub const OPS: &[(&str, Lowering)] = &[];
