//! Rules written as Rust functions over the e-graph.
//!
//! Most rewrites here depend on attributes (permutations compose, shapes must agree,
//! a constant must be exactly 1), which egg's patterns cannot state. A [`Rule`] is a
//! function from an e-class to the [`Term`]s equal to it; it runs inside egg's `Runner`
//! (limits, scheduling, per-rule counts) as an ordinary `Rewrite`.

use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use graphc_ir::Op;

use super::analysis::{TEGraph, TensorAnalysis};
use super::lang::TNode;

/// A term to add: an existing class, or an op applied to terms.
#[derive(Clone, Debug)]
pub enum Term {
    Class(Id),
    Node(Op, Vec<Term>),
}

impl Term {
    pub fn node(op: Op, children: Vec<Term>) -> Term {
        Term::Node(op, children)
    }

    fn add(&self, eg: &mut TEGraph) -> Id {
        match self {
            Term::Class(id) => *id,
            Term::Node(op, children) => {
                let ids = children.iter().map(|c| c.add(eg)).collect();
                eg.add(TNode::new(op.clone(), ids))
            }
        }
    }
}

/// Finds the terms equal to an e-class.
pub type RuleFn = fn(&TEGraph, Id) -> Vec<Term>;

#[derive(Clone)]
struct FnRule(RuleFn);

impl Searcher<TNode, TensorAnalysis> for FnRule {
    fn search_eclass_with_limit(&self, eg: &TEGraph, eclass: Id, limit: usize) -> Option<SearchMatches<'_, TNode>> {
        if limit == 0 || (self.0)(eg, eclass).is_empty() {
            return None;
        }
        Some(SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        vec![]
    }
}

impl Applier<TNode, TensorAnalysis> for FnRule {
    fn apply_one(
        &self,
        eg: &mut TEGraph,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<TNode>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let mut changed = Vec::new();
        for term in (self.0)(eg, eclass) {
            let id = term.add(eg);
            if eg.union(eclass, id) {
                changed.push(id);
            }
        }
        changed
    }
}

/// An egg rewrite running `f`.
pub fn rule(name: &str, f: RuleFn) -> Rewrite<TNode, TensorAnalysis> {
    Rewrite::new(name, FnRule(f), FnRule(f)).expect("function rules bind no variables")
}

/// The e-nodes of a class.
pub fn nodes(eg: &TEGraph, id: Id) -> &[TNode] {
    &eg[id].nodes
}

/// `(node, its children)` for each node of `id` whose op satisfies `pred`.
pub fn nodes_where(eg: &TEGraph, id: Id, pred: impl Fn(&Op) -> bool) -> impl Iterator<Item = &TNode> {
    nodes(eg, id).iter().filter(move |n| pred(n.op()))
}
