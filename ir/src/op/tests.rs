use super::*;
use std::collections::HashSet;

#[test]
fn every_kind_name_parses_back_to_the_kind() {
    let mut names = HashSet::new();
    for k in OpKind::all() {
        assert!(names.insert(k.name()), "name `{}` is given twice", k.name());
        assert_eq!(OpKind::from_name(k.name()), Some(k), "{}", k.name());
    }
    assert_eq!(
        names.len(),
        22 + 2 + 2 * crate::PoolOp::ALL.len() + UnaryOp::ALL.len() + BinaryOp::ALL.len() + ReduceOp::ALL.len()
    );
    assert_eq!(OpKind::from_name("no_such_op"), None);
}

#[test]
fn every_op_prints_its_kind_name() {
    let ops = [
        Op::Select,
        Op::MatMul,
        Op::Unary(UnaryOp::Relu),
        Op::Binary(BinaryOp::Add),
        Op::Concat { axis: 0 },
        Op::Reduce {
            op: ReduceOp::Mean,
            axes: vec![1],
            keepdims: true,
        },
        Op::ArgReduce {
            op: ArgReduceOp::ArgMin,
            axis: 0,
            keepdims: false,
        },
    ];
    for op in ops {
        assert_eq!(OpKind::from_name(op.name()), Some(op.kind()), "{op}");
    }
}
