//! Wide programs compile in work near-linear in their size: a sum of many inputs (one
//! kernel reading them all), a sum whose operands all name one input, or every other
//! one does (one value read many times, in f32 and bf16, where it is a computed cast),
//! a sum of many weights (folded at compile time), a concat of many matmuls (as many
//! kernels and buffers all live at once), a chain of many matmuls. Each is compiled at `n / 10` and `n`, counting the steps every stage takes
//! (`graphc_ir::work`) and the bytes it allocates: 10x the size may cost at most 15x
//! the steps and 25x the bytes (vectors that double as they grow can take 16x for 10x
//! the elements); a quadratic step costs 100x. Counts, unlike times, do not depend on what else the
//! machine is doing; `cargo bench --bench scaling` times the same programs.

mod wide_programs;

use graphc_compiler::passes::precision::Precision;
use graphc_compiler::{compile, CompileOptions, Compiled};
use graphc_ir::work::{self, Work};
use graphc_ir::{DType, Graph, TensorType};
use graphc_testkit::alloc::{self, Allocs};
use wide_programs::{matmuls, sum_of_inputs, sum_of_repeated_input, sum_of_weights};

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// The most 10x the input may multiply the counted steps and the bytes allocated by.
const STEPS_LIMIT: f64 = 15.0;
const BYTES_LIMIT: f64 = 25.0;

/// The compiled program and what compiling it cost (checking on a second compile that
/// the plan is deterministic).
fn counted(g: &Graph, opts: &CompileOptions) -> (Compiled, Work, Allocs) {
    let ((c, w), a) = alloc::measure(|| work::measure(|| compile(g, opts).unwrap()));
    let c2 = compile(g, opts).unwrap();
    let key = |c: &Compiled| (c.plan.arena_bytes, c.plan.buffers.clone(), c.plan.schedule);
    assert!(key(&c2) == key(&c), "the plan is deterministic");
    (c, w, a)
}

/// Fails unless `big` (at 10x the input) costs at most [`STEPS_LIMIT`] times `small`
/// in counted steps and [`BYTES_LIMIT`] times in bytes allocated.
fn assert_near_linear(what: &str, (w_small, a_small): (Work, Allocs), (w_big, a_big): (Work, Allocs)) {
    let (steps, bytes) = (w_big.growth_over(&w_small), a_big.growth_over(&a_small));
    eprintln!(
        "{what}: {steps:.1}x the steps ({} -> {}), {bytes:.1}x the bytes allocated ({} -> {})",
        w_small.total(),
        w_big.total(),
        a_small.bytes,
        a_big.bytes
    );
    assert!(
        steps <= STEPS_LIMIT,
        "{what}: {steps:.1}x the steps: {}",
        w_big.compare(&w_small)
    );
    assert!(
        bytes <= BYTES_LIMIT,
        "{what}: {bytes:.1}x the bytes allocated: {a_small:?} -> {a_big:?}"
    );
}

/// Compiles `build(n / 10)` and `build(n)`, checks each, and fails when the work grows
/// faster than the input.
fn near_linear(what: &str, n: usize, build: impl Fn(usize) -> Graph, check: impl Fn(&Compiled, usize)) {
    near_linear_at(what, Precision::Fp32, n, build, check);
}

/// [`near_linear`], compiled at `precision`.
fn near_linear_at(
    what: &str,
    precision: Precision,
    n: usize,
    build: impl Fn(usize) -> Graph,
    check: impl Fn(&Compiled, usize),
) {
    let opts = CompileOptions {
        precision,
        ..CompileOptions::default()
    };
    let (small, big) = (build(n / 10), build(n));
    let (c, w_small, a_small) = counted(&small, &opts);
    check(&c, n / 10);
    let (c, w_big, a_big) = counted(&big, &opts);
    check(&c, n);
    assert_near_linear(&format!("{what} ({precision:?})"), (w_small, a_small), (w_big, a_big));
}

#[test]
fn sum_of_20k_inputs_is_one_kernel_in_near_linear_work() {
    near_linear("sum of inputs", 20_000, sum_of_inputs, |c, n| {
        assert_eq!(c.program.kernels.len(), 1);
        assert_eq!(c.graph.inputs().len(), n);
    });
}

/// Fusion alone (the whole pipeline hides it under the optimizer's linear cost): one
/// kernel reading 100k inputs lists each once without a scan of those listed so far.
#[test]
fn fusing_a_sum_of_100k_inputs_is_near_linear() {
    let fuse = |n: usize| {
        let g = sum_of_inputs(n);
        let ((p, w), a) = alloc::measure(|| work::measure(|| graphc_compiler::fuse::fuse(&g).unwrap()));
        assert_eq!(p.kernels.len(), 1);
        assert_eq!(p.inputs.len(), n);
        (w, a)
    };
    assert_near_linear("fusing a sum", fuse(10_000), fuse(100_000));
}

/// `Sum(x, x, ..., x)`: one kernel reading `x` once. Listing a value's users scanned
/// the list for each one (100k operands: 4.0 s of `graphc plan`); at bf16 every add
/// reads `cast(x)`, a computed value whose group took in its 100k readers one merge at
/// a time, each merge walking and re-sorting all of them (81.6 s).
#[test]
fn sum_of_one_input_named_20k_times_is_one_kernel_in_near_linear_work() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        near_linear_at(
            "sum of one input",
            precision,
            20_000,
            |n| sum_of_repeated_input(n, 1),
            |c, _| {
                assert_eq!(c.program.kernels.len(), 1);
                assert_eq!(c.graph.inputs().len(), 1);
            },
        );
    }
}

/// Every other operand is the one input, the rest inputs of their own.
#[test]
fn sum_of_half_one_input_is_one_kernel_in_near_linear_work() {
    for precision in [Precision::Fp32, Precision::Bf16] {
        near_linear_at(
            "sum of half one input",
            precision,
            20_000,
            |n| sum_of_repeated_input(n, 2),
            |c, n| {
                assert_eq!(c.program.kernels.len(), 1);
                assert_eq!(c.graph.inputs().len(), n / 2 + 1);
            },
        );
    }
}

#[test]
fn sum_of_20k_weights_folds_in_near_linear_work() {
    near_linear("sum of weights", 20_000, sum_of_weights, |c, _| {
        assert_eq!(c.program.kernels.len(), 1);
        assert_eq!(c.graph.weights().len(), 1, "the chain folds into one weight");
        let name = c.graph.weights().keys().next().cloned().unwrap_or_default();
        assert!(
            name.len() < 40,
            "folded weight name: {}...",
            &name[..40.min(name.len())]
        );
    });
}

/// Both sizes above `EXACT_MAX_BUFFERS` (4096), where offsets are placed by the
/// `O(n log n)` sweep: below it every greedy order and the search run, by design.
#[test]
fn concat_of_50k_matmuls_plans_in_near_linear_work() {
    near_linear(
        "concat of matmuls",
        50_000,
        |n| matmuls(n, true),
        |c, n| {
            assert!(c.program.kernels.len() > n);
            let live = c.plan.peak_live.len();
            assert!(live >= n, "{live} tensors live at the peak");
            assert!(c.plan.arena_bytes >= c.plan.lower_bound_bytes);
        },
    );
}

/// As above: both sizes above `EXACT_MAX_BUFFERS` (in-place reuse leaves about one
/// arena buffer per matmul); below it, the search's share of the work depends on its
/// time budget.
#[test]
fn chain_of_50k_matmuls_plans_in_near_linear_work() {
    near_linear(
        "chain of matmuls",
        50_000,
        |n| matmuls(n, false),
        |c, n| {
            assert_eq!(c.program.kernels.len(), n);
            let t = TensorType::new(DType::F32, [2, 2]);
            assert!(c.plan.arena_bytes <= 4 * t.size_bytes().div_ceil(256) as u64 * 256);
        },
    );
}
