//! The text format's unit tests: the training ops (the rest is in `ir/tests/text_format.rs`).

use crate::{parse, print};

/// The training ops print and parse back: `scatter_add`, `attention_lse`,
/// `attention_grad` (its `wrt`, and `zero_masked_rows` only when set).
#[test]
fn training_ops_round_trip() {
    let src = r#"graph {
  %0 = input "u" : f32[2,3,4]
  %1 = input "i" : i64[3]
  %2 = scatter_add(%0, %1) {axis=1, size=5} : f32[2,5,4]
  %3 = input "q" : f32[1,2,3,4]
  %4 = input "k" : f32[1,1,5,4]
  %5 = input "v" : f32[1,1,5,4]
  %6 = input "do" : f32[1,2,3,4]
  %7 = input "delta" : f32[1,2,3]
  %8 = attention_lse(%3, %4) {scale=0.5, causal=true} : f32[1,2,3]
  %9 = attention_grad(%3, %4, %5, %6, %8, %7) {wrt=k, scale=0.5, causal=true, zero_masked_rows=true} : f32[1,1,5,4]
  %10 = attention_grad(%3, %4, %5, %6, %8, %7) {wrt=q, scale=0.5, causal=false} : f32[1,2,3,4]
  output "s" = %2
  output "dk" = %9
  output "dq" = %10
}
"#;
    let g = parse(src).unwrap();
    let t = print(&g);
    assert_eq!(parse(&t).unwrap(), g.canonicalize());
    for line in [
        "scatter_add(%0, %1) {axis=1, size=5} : f32[2,5,4]",
        "{wrt=k, scale=0.5, causal=true, zero_masked_rows=true} : f32[1,1,5,4]",
        "{wrt=q, scale=0.5, causal=false} : f32[1,2,3,4]",
    ] {
        assert!(t.contains(line), "missing {line:?} in\n{t}");
    }
    let bad = src.replace("wrt=k", "wrt=x");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(e.contains("`q`, `k` or `v`"), "{e}");
    let bad = src.replace("f32[1,1,5,4]\n  %10", "f32[1,2,3,4]\n  %10");
    assert!(parse(&bad).is_err());
}
