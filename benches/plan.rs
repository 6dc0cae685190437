//! The memory planner on real models: arena / lower bound and planning time.
//!
//! `cargo bench --bench plan` prints a markdown table for the examples, the ONNX
//! fixtures and a 12-layer GPT (d_model 1024, 16 heads, batch 8, sequence 1024, bf16):
//! kernels, the schedule chosen, the lower bound (most bytes live at once), the arena and
//! the best greedy arena (both / lower bound), buffers written in place, and the time to
//! plan (schedule + liveness + offsets; median of runs on the fused program) next to the
//! whole compile. It exits non-zero if an arena exceeds 1.02x its lower bound or the GPT
//! takes 50 ms or more to plan. `GRAPHC_PLAN_BENCH_SKIP_GPT=1` skips the GPT (whose
//! 151M random bf16 weights take a few seconds to build).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use graphc::models::{gpt, mlp, GptConfig, MlpConfig};
use graphc_compiler::plan::{apply_schedule, plan_memory, schedule, verify_plan, MemoryOptions};
use graphc_ir::{DType, Graph};

const MIB: f64 = (1u64 << 20) as f64;

fn median(v: Vec<Duration>) -> Duration {
    let mut secs: Vec<f64> = v.iter().map(Duration::as_secs_f64).collect();
    Duration::from_secs_f64(graphc_ir::compare::median(&mut secs))
}

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut models: Vec<(String, Box<dyn Fn() -> Graph>)> = vec![
        (
            "mlp".into(),
            Box::new(|| mlp(&MlpConfig::default()).expect("mlp builds")),
        ),
        (
            "transformer block".into(),
            Box::new(|| gpt(&GptConfig::default()).expect("block builds")),
        ),
    ];
    for name in ["gpt2", "bert", "llama", "vit"] {
        let path = root.join(format!("tests/fixtures/onnx/{name}/model.onnx"));
        models.push((
            format!("{name} (ONNX)"),
            Box::new(move || graphc::load_model(&path, &[]).expect("fixture loads")),
        ));
    }
    let dynamic = root.join("tests/fixtures/onnx/gpt2_dynamic/model.onnx");
    models.push((
        "gpt2 (ONNX) batch 64, seq 64".into(),
        Box::new(move || {
            graphc::load_model(&dynamic, &[("batch".into(), 64), ("seq".into(), 64)]).expect("fixture loads")
        }),
    ));
    let gpt_cfg = GptConfig {
        batch: 8,
        seq: 1024,
        d_model: 1024,
        heads: 16,
        layers: 12,
        dtype: DType::BF16,
        seed: 0,
    };
    let gpt_name = "GPT 12 layers, d 1024, 16 heads, b 8, s 1024, bf16";
    if std::env::var_os("GRAPHC_PLAN_BENCH_SKIP_GPT").is_none() {
        models.push((gpt_name.into(), Box::new(move || gpt(&gpt_cfg).expect("GPT builds"))));
    }

    println!("| model | kernels | arena buffers | schedule | lower bound | arena / LB | greedy / LB | in place | plan time (median) | compile |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut ok = true;
    let opts = MemoryOptions::default();
    for (name, build) in &models {
        let g = build();
        let t0 = Instant::now();
        let c = graphc::compile(&g).expect("compiles");
        let compile = t0.elapsed();
        drop(g);
        if let Err(e) = verify_plan(&c.program, &c.plan) {
            println!("| {name} | VERIFY FAILED: {e} |");
            ok = false;
            continue;
        }
        // Planning alone, from the fused program in fusion's order.
        let runs = 7;
        let times: Vec<Duration> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let s = schedule(&c.program);
                let p = apply_schedule(&c.program, &s.order);
                let plan = plan_memory(&p, &opts).expect("plans");
                std::hint::black_box(plan);
                t.elapsed()
            })
            .collect();
        let plan_time = median(times);
        let p = &c.plan;
        let lb = p.lower_bound_bytes.max(1) as f64;
        println!(
            "| {name} | {} | {} | {} | {:.2} MiB | {:.3} | {:.3} | {} | {:.2} ms | {:.0} ms |",
            p.kernels,
            p.buffers.len(),
            p.schedule,
            p.lower_bound_bytes as f64 / MIB,
            p.arena_bytes as f64 / lb,
            p.greedy_arena_bytes as f64 / lb,
            p.in_place,
            plan_time.as_secs_f64() * 1e3,
            compile.as_secs_f64() * 1e3
        );
        if p.ratio() > 1.02 {
            println!("FAIL: {name}: arena / lower bound {:.3} > 1.02", p.ratio());
            ok = false;
        }
        if name == gpt_name {
            let arena = p.arena_bytes as f64 / MIB;
            println!();
            println!(
                "{name}: arena {arena:.0} MiB of activations; PyTorch 2.11 on an H200 peaks at 833 MiB \
                 eager without SDPA ({:.2}x of it), 400 MiB with torch.compile ({:.2}x), 192 MiB with \
                 torch.compile and SDPA ({:.2}x). Weights {:.0} MiB; total {:.0} MiB.",
                arena / 833.0,
                arena / 400.0,
                arena / 192.0,
                p.weights_bytes as f64 / MIB,
                p.total_bytes as f64 / MIB
            );
            println!("schedules tried (peak bytes): {:?}", c.schedule.candidates);
            println!("largest tensors at the peak (step {}):", p.peak_step);
            for t in p.peak_live.iter().take(6) {
                println!(
                    "  b{} {} ({} {}): {:.1} MiB",
                    t.buffer.0,
                    t.name.as_deref().unwrap_or("-"),
                    t.kernel,
                    t.op,
                    t.bytes as f64 / MIB
                );
            }
            if plan_time >= Duration::from_millis(50) {
                println!(
                    "FAIL: {name}: planning took {:.1} ms (target < 50 ms)",
                    plan_time.as_secs_f64() * 1e3
                );
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
