//! Rewrite rules, one file per topic. See README.md for the policy.

mod identities;
mod layout;
mod scale;

use egg::Rewrite;

use super::analysis::TensorAnalysis;
use super::lang::TNode;

/// Every rule, in a fixed order.
pub fn all() -> Vec<Rewrite<TNode, TensorAnalysis>> {
    identities::rules()
        .into_iter()
        .chain(layout::rules())
        .chain(scale::rules())
        .collect()
}
