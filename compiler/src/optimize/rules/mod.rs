//! Rewrite rules, one file per topic. See README.md for the policy.

mod attention;
mod broadcast;
mod causal;
mod composite;
mod gather;
mod identities;
mod layout;
mod scale;

use egg::Rewrite;

use super::analysis::TensorAnalysis;
use super::lang::TNode;

/// Rules whose rewrite is not bit-exact (documented in README.md): outputs agree to a
/// few ulps, not bitwise.
pub const INEXACT: &[&str] = &["gelu-tanh", "gelu-erf", "attention"];

/// Every rule, in a fixed order.
pub fn all() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    identities::rules()
        .into_iter()
        .chain(layout::rules())
        .chain(broadcast::rules())
        .chain(scale::rules())
        .chain(gather::rules())
        .chain(composite::rules())
        .chain(attention::rules())
        .collect()
}
