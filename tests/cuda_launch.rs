//! The CUDA executor without a GPU: the translation of a plan into launches (argument
//! offsets, GEMM layouts, grid sizes, scratch) run on the CPU by the launch emulator
//! and compared with the CPU executor; the API's and CLI's error paths on a machine
//! with no driver.

mod common;

use std::collections::HashMap;

use common::{example_models as models, fixtures, random_inputs, rel_l2, repo_path, scratch_epilogue_model};
use graphc::ir::{DType, Tensor};
use graphc::models::{gpt, mlp, GptConfig, MlpConfig};
use graphc_compiler::codegen::{self, GridSize, ParamTarget};
use graphc_compiler::plan::Place;
use graphc_runtime::cuda::{
    check_device_memory, emulate, plan_launches, CudaError, DevAddr, DeviceInfo, Launch, LaunchPlan, Region, Session,
    SessionOptions,
};

fn launches(c: &graphc::Compiled, device: &DeviceInfo) -> LaunchPlan {
    let kernels = codegen::generate_all(&c.program).unwrap();
    plan_launches(&c.program, &c.plan, &kernels, device).unwrap()
}

/// Relative L2 tolerance of a GPU output against the CPU executor (the GPU check's).
fn tolerance(d: DType) -> f64 {
    graphc::selftest::tolerance(d, false)
}

fn compare(name: &str, got: &[(String, Tensor)], want: &[(String, Tensor)]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for ((n1, a), (n2, b)) in got.iter().zip(want) {
        assert_eq!(n1, n2, "{name}");
        assert_eq!(a.ty(), b.ty(), "{name}/{n1}");
        let err = rel_l2(&a.to_f64_vec(), &b.to_f64_vec());
        assert!(
            err <= tolerance(a.ty().dtype),
            "{name}/{n1}: emulated launches vs CPU executor: relative L2 {err:.3e}"
        );
    }
}

/// Every example, on both reference devices: the launch list, run on the CPU, gives the
/// CPU executor's outputs.
#[test]
fn emulated_launches_match_the_cpu_executor_on_the_examples() {
    for (name, g) in models() {
        let c = graphc::compile(&g).unwrap();
        let inputs = random_inputs(&g, 5);
        let want = graphc::run_cpu(&c, inputs.clone()).unwrap();
        for device in [DeviceInfo::rtx_4090d(), DeviceInfo::h200()] {
            let lp = launches(&c, &device);
            let got = emulate(&c.program, &lp, c.graph.weights(), &inputs)
                .unwrap_or_else(|e| panic!("{name} on {}: {e}", device.arch));
            compare(&format!("{name} ({})", device.arch), &got, &want);
        }
    }
}

/// The exported fixtures (GPT-2, BERT, Llama, ViT, and GPT-2 with symbolic dims).
#[test]
fn emulated_launches_match_the_cpu_executor_on_the_fixtures() {
    for (name, dims) in fixtures() {
        let dir = repo_path(&format!("tests/fixtures/onnx/{name}"));
        let g = graphc::load_model(&dir.join("model.onnx"), &dims).unwrap();
        let c = graphc::compile(&g).unwrap();
        let inputs = random_inputs(&g, 3);
        let want = graphc::run_cpu(&c, inputs.clone()).unwrap();
        let lp = launches(&c, &DeviceInfo::h200());
        assert!(lp.gemm_count() > 0, "{name}: has GEMMs");
        let got = emulate(&c.program, &lp, c.graph.weights(), &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        compare(name, &got, &want);
    }
}

/// The translation itself: every argument is its buffer's planned place, every grid is
/// what codegen asked for on that device, and GEMM matrices are the row-major operands
/// seen column-major.
#[test]
fn launch_arguments_are_the_planned_places() {
    let c = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    let kernels = codegen::generate_all(&c.program).unwrap();
    for device in [DeviceInfo::rtx_4090d(), DeviceInfo::h200()] {
        let lp = plan_launches(&c.program, &c.plan, &kernels, &device).unwrap();
        let mut steps_with_kernel = 0;
        for l in &lp.launches {
            let Launch::Kernel(k) = l else { continue };
            steps_with_kernel += 1;
            let ck = &kernels[k.step];
            let want_grid = match ck.launch.grid {
                GridSize::Fixed { blocks } => blocks,
                GridSize::PerSm {
                    blocks_per_sm,
                    max_blocks,
                } => (device.sm_count * blocks_per_sm).min(max_blocks),
            };
            assert_eq!(k.grid, want_grid, "{}", k.kernel);
            assert_eq!(k.block, ck.launch.block);
            let step = &c.plan.steps[k.step];
            for (p, a) in ck.params.iter().zip(&k.args) {
                match p.target {
                    ParamTarget::Buffer(b) => {
                        let arg = step
                            .args
                            .iter()
                            .find(|x| x.buffer == b)
                            .expect("the plan lists the argument");
                        match arg.place {
                            Place::Arena { offset } => assert_eq!(*a, DevAddr::new(Region::Arena, offset)),
                            Place::Weight { .. } | Place::Constant => assert_eq!(a.region, Region::Weights),
                            Place::Input { .. } | Place::Output { .. } => assert_eq!(a.region, Region::Io),
                        }
                    }
                    ParamTarget::GemmScratch => {
                        assert_eq!(*a, DevAddr::new(Region::Arena, step.scratch.expect("planned scratch")))
                    }
                }
                assert_eq!(a.offset % 256, 0, "{}: every tensor is 256-byte aligned", k.kernel);
            }
        }
        assert!(steps_with_kernel > 0);
        // Every step is launched: a GEMM, a kernel or both.
        for s in 0..c.program.kernels.len() {
            assert!(lp.launches.iter().any(|l| l.step() == s), "step {s} has no launch");
        }
        // A linear layer: x [m, k] @ W [k, n] is cuBLASLt's D^T = W^T x^T (m and n swap).
        for (l, ck) in lp.launches.iter().filter_map(|l| match l {
            Launch::Gemm(g) => Some((g, kernels[g.step].gemm.as_ref().unwrap())),
            _ => None,
        }) {
            assert_eq!((l.lt.m, l.lt.n, l.lt.k), (ck.n, ck.m, ck.k));
            assert_eq!((l.lt.transa, l.lt.transb), (ck.b.trans, ck.a.trans));
            assert_eq!((l.lt.d.rows, l.lt.d.cols, l.lt.d.ld), (ck.n, ck.m, ck.n as i64));
        }
    }
}

/// The launch list of the transformer block, as text (regions, offsets, grids, GEMMs).
#[test]
fn snapshot_transformer_block_launches() {
    let c = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    insta::assert_snapshot!(launches(&c, &DeviceInfo::h200()).describe());
}

/// The emulator is a real check: a launch argument moved by one slot, or a GEMM
/// transpose flag flipped, changes the outputs or is rejected.
#[test]
fn a_wrong_launch_is_caught() {
    let g = gpt(&GptConfig::default()).unwrap();
    let c = graphc::compile(&g).unwrap();
    let inputs = random_inputs(&g, 1);
    let want = graphc::run_cpu(&c, inputs.clone()).unwrap();
    let lp = launches(&c, &DeviceInfo::h200());
    let differs = |bad: &LaunchPlan| match emulate(&c.program, bad, c.graph.weights(), &inputs) {
        Err(_) => true,
        Ok(got) => got.iter().zip(&want).any(|((_, a), (_, b))| {
            rel_l2(&a.to_f64_vec(), &b.to_f64_vec()).partial_cmp(&1e-5) != Some(std::cmp::Ordering::Less)
        }),
    };
    let mut caught = 0;
    let mut tried = 0;
    for (i, l) in lp.launches.iter().enumerate() {
        match l {
            Launch::Kernel(k) => {
                for j in 0..k.args.len() {
                    if k.args[j].region != Region::Arena {
                        continue;
                    }
                    let mut bad = lp.clone();
                    if let Launch::Kernel(b) = &mut bad.launches[i] {
                        b.args[j].offset += 256;
                    }
                    tried += 1;
                    caught += differs(&bad) as usize;
                }
            }
            Launch::Gemm(_) => {
                let mut bad = lp.clone();
                if let Launch::Gemm(b) = &mut bad.launches[i] {
                    b.lt.transa = !b.lt.transa;
                    std::mem::swap(&mut b.lt.a.rows, &mut b.lt.a.cols);
                }
                tried += 1;
                caught += differs(&bad) as usize;
            }
        }
    }
    eprintln!("caught {caught} of {tried} wrong launches");
    assert!(tried > 10);
    // A moved argument can land on bytes equal to the right ones only by chance
    // (a dead buffer's old value): nearly all must be caught.
    assert!(caught * 10 >= tried * 9, "caught {caught} of {tried}");
}

#[test]
fn the_plan_and_the_launches_must_agree() {
    let c = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    let kernels = codegen::generate_all(&c.program).unwrap();
    let dev = DeviceInfo::h200();
    // The plan of another program.
    let other = graphc::compile(&mlp(&MlpConfig::default()).unwrap()).unwrap();
    let e = plan_launches(&c.program, &other.plan, &kernels, &dev).unwrap_err();
    assert!(e.to_string().contains("kernels"), "{e}");
    // Kernels of another program.
    let e = plan_launches(&c.program, &c.plan, &kernels[1..], &dev).unwrap_err();
    assert!(e.to_string().contains("CUDA kernels"), "{e}");
    // A plan without the GEMM scratch a generated epilogue reads.
    let two = graphc::compile(&scratch_epilogue_model()).unwrap();
    let two_kernels = codegen::generate_all(&two.program).unwrap();
    plan_launches(&two.program, &two.plan, &two_kernels, &dev).unwrap();
    let mut bad = two.plan.clone();
    let s = bad.scratch.pop().unwrap();
    bad.steps[s.step as usize].scratch = None;
    let e = plan_launches(&two.program, &bad, &two_kernels, &dev).unwrap_err();
    assert!(e.to_string().contains("scratch"), "{e}");
    // A device whose blocks are smaller than the kernels' blocks.
    let tiny = DeviceInfo {
        max_threads_per_block: 64,
        ..DeviceInfo::h200()
    };
    let e = plan_launches(&c.program, &c.plan, &kernels, &tiny).unwrap_err();
    assert!(e.to_string().contains("threads"), "{e}");
}

/// A matmul with an erf GELU (not cuBLASLt's epilogue) writes its product into its
/// output and the generated epilogue overwrites it in place: no GEMM scratch, the same
/// results; with two stores reading the product, scratch as before.
#[test]
fn a_generated_epilogue_overwrites_the_product_in_place() {
    let c = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    assert!(c.plan.scratch.is_empty(), "{:?}", c.plan.scratch);
    let lp = launches(&c, &DeviceInfo::h200());
    let mut in_place = 0;
    for l in &lp.launches {
        let Launch::Kernel(k) = l else { continue };
        let gemm = lp.launches.iter().find_map(|g| match g {
            Launch::Gemm(g) if g.step == k.step => Some(g),
            _ => None,
        });
        if let Some(g) = gemm {
            // The epilogue reads D where the GEMM wrote it and writes the same place.
            let d = g.lt.d.addr;
            assert!(k.args.contains(&d), "{}: reads D", k.kernel);
            in_place += usize::from(k.args.iter().filter(|a| **a == d).count() == 2);
        }
    }
    assert!(in_place > 0, "no epilogue runs in place");
    let g = gpt(&GptConfig::default()).unwrap();
    let inputs = random_inputs(&g, 8);
    let want = graphc::run_cpu(&c, inputs.clone()).unwrap();
    let got = emulate(&c.program, &lp, c.graph.weights(), &inputs).unwrap();
    compare("gpt block, epilogue in place", &got, &want);
    let two_graph = scratch_epilogue_model();
    let two = graphc::compile(&two_graph).unwrap();
    assert_eq!(two.plan.scratch.len(), 1);
    let inputs = random_inputs(&two_graph, 9);
    let want = graphc::run_cpu(&two, inputs.clone()).unwrap();
    let lp = launches(&two, &DeviceInfo::h200());
    let got = emulate(&two.program, &lp, two.graph.weights(), &inputs).unwrap();
    compare("two stores, scratch", &got, &want);
}

#[test]
fn device_memory_too_small_states_bytes_asked_and_free() {
    let c = graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap();
    let lp = launches(&c, &DeviceInfo::h200());
    let need = lp.layout.total_bytes();
    assert!(need >= c.plan.arena_bytes + c.plan.weights_bytes + c.plan.workspace_bytes);
    check_device_memory(&lp.layout, need, need, "GPU").unwrap();
    let e = check_device_memory(&lp.layout, need - 1, 80 << 30, "NVIDIA H200").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CudaError::OutOfMemory { .. }));
    assert!(
        msg.contains(&need.to_string()) && msg.contains(&(need - 1).to_string()),
        "{msg}"
    );
    assert!(
        msg.contains("arena") && msg.contains("weights") && msg.contains("NVIDIA H200"),
        "{msg}"
    );
}

/// On a machine without a driver or GPU the session says so (no panic) and the CPU
/// executor still works in the same process.
#[test]
fn without_a_gpu_the_session_says_so_and_cpu_still_works() {
    let g = mlp(&MlpConfig::default()).unwrap();
    let c = graphc::compile(&g).unwrap();
    let inputs: HashMap<String, Tensor> = random_inputs(&g, 2);
    match Session::new(&c, SessionOptions::default()) {
        Ok(mut s) => {
            // A GPU machine: the session runs and agrees with the CPU.
            let got = s.run(&inputs).unwrap();
            compare("mlp on the GPU", &got, &graphc::run_cpu(&c, inputs.clone()).unwrap());
        }
        Err(e) => {
            assert!(e.is_unavailable(), "unexpected error without a GPU: {e}");
            // The library says what is missing; the CLI adds the command to run instead
            // (tests/cli/hints.rs).
            let msg = e.to_string();
            assert!(msg.starts_with("no CUDA"), "{msg}");
        }
    }
    assert!(graphc::run_cpu(&c, inputs).is_ok());
}

/// Every self-test case (GEMMs of every dtype and epilogue, elementwise, row and op
/// kernels, attention, two models) passes through the H200 launch lists, emulated.
#[test]
fn selftest_cases_pass_under_the_emulator() {
    let cases = graphc::selftest::cases().unwrap();
    assert!(cases.len() > 50);
    let device = DeviceInfo::h200();
    let mut emu = |c: &graphc::Compiled, inputs: &HashMap<String, Tensor>| {
        let lp = launches(c, &device);
        emulate(&c.program, &lp, c.graph.weights(), inputs).map_err(|e| graphc::Error::Cuda(e.into()))
    };
    let mut failed = Vec::new();
    for case in &cases {
        let r = graphc::selftest::run_case(case, false, &mut emu);
        if !r.pass {
            failed.push(format!("{}: {:?} {} {:.2e}", r.name, r.error, r.worst_output, r.rel_l2));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
