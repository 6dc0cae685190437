//! The memory plan's reports: the summary and the terminal picture of the example
//! transformer block (snapshots), the SVG (well-formed, one rect per buffer, escaped
//! names) and the over-budget diagnosis.

mod common;

use graphc::models::{gpt, GptConfig};
use graphc::{CompileOptions, Compiled, MemoryOptions, Rerun};
use graphc_compiler::kernel::{BufferId, Program};
use graphc_compiler::plan::report::{self, human_bytes};
use graphc_compiler::plan::{
    check_budget, check_budget_for, over_budget_diagnosis, Arch, Device, MemoryPlan, PlanJson, PlanStep, PlannedBuffer,
    Remedy, Scheduler, StepKind, Strategy,
};

fn block() -> Compiled {
    graphc::compile(&gpt(&GptConfig::default()).unwrap()).unwrap()
}

fn with_budget(budget: u64) -> Compiled {
    let opts = CompileOptions {
        memory: MemoryOptions {
            budget_bytes: budget,
            ..Default::default()
        },
        ..Default::default()
    };
    graphc::compile_with(&gpt(&GptConfig::default()).unwrap(), &opts).unwrap()
}

#[test]
fn snapshot_transformer_block_summary() {
    let c = block();
    insta::assert_snapshot!("transformer_block_plan_summary", report::summary(&c.program, &c.plan));
}

#[test]
fn snapshot_transformer_block_picture() {
    let c = block();
    insta::assert_snapshot!("transformer_block_plan_picture", report::picture(&c.plan, 64, 16));
}

#[test]
fn reports_are_deterministic() {
    let (a, b) = (block(), block());
    assert_eq!(
        report::summary(&a.program, &a.plan),
        report::summary(&b.program, &b.plan)
    );
    assert_eq!(report::svg(&a.program, &a.plan), report::svg(&b.program, &b.plan));
}

/// A minimal XML well-formedness check: tags balance, attribute values are quoted and
/// hold no raw `<`, and every `&` starts an entity. Returns the element names opened.
fn check_xml(text: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut opened = Vec::new();
    let check_amp = |s: &str| {
        for (i, _) in s.match_indices('&') {
            let rest = &s[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| rest.starts_with(e)),
                "raw & in {s:?}"
            );
        }
    };
    let mut rest = text;
    while let Some(lt) = rest.find('<') {
        check_amp(&rest[..lt]);
        let after = &rest[lt + 1..];
        // The tag ends at the first `>` outside quotes.
        let mut in_quote = false;
        let mut end = None;
        for (i, ch) in after.char_indices() {
            match ch {
                '"' => in_quote = !in_quote,
                '<' if in_quote => panic!("raw < in an attribute: {}", &after[..i]),
                '>' if !in_quote => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.expect("an unclosed tag");
        let tag = &after[..end];
        check_amp(tag);
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "mismatched </{name}>");
        } else if !tag.starts_with('?') && !tag.starts_with('!') {
            let name: String = tag.chars().take_while(|c| !c.is_whitespace() && *c != '/').collect();
            assert!(!name.is_empty(), "empty tag name in <{tag}>");
            opened.push(name.clone());
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &after[end + 1..];
    }
    check_amp(rest);
    assert!(stack.is_empty(), "unclosed elements: {stack:?}");
    assert!(rest.trim().is_empty(), "text after the root element");
    opened
}

#[test]
fn svg_is_well_formed_with_one_rect_per_buffer() {
    let c = block();
    let svg = report::svg(&c.program, &c.plan);
    assert!(svg.starts_with("<svg "), "{svg}");
    let opened = check_xml(&svg);
    assert_eq!(opened.first().map(String::as_str), Some("svg"));
    assert_eq!(svg.matches("<rect class=\"buffer\"").count(), c.plan.buffers.len());
    assert!(!c.plan.buffers.is_empty());
    assert!(svg.contains("stroke-dasharray=\"6 4\""), "the lower-bound line");
    for b in &c.plan.buffers {
        let tip = format!("<title>b{}", b.buffer.0);
        assert!(
            svg.match_indices(&tip)
                .any(|(i, _)| !svg[i + tip.len()..].starts_with(|c: char| c.is_ascii_digit())),
            "tooltip of b{}",
            b.buffer.0
        );
    }
}

/// A hand-made plan: one kernel, one arena buffer with a hostile name.
fn tiny_plan(name: &str, kernels: usize, buffers: Vec<PlannedBuffer>) -> MemoryPlan {
    let arena = buffers.iter().map(|b| b.offset + b.bytes).max().unwrap_or(0);
    MemoryPlan {
        arch: Arch::default(),
        kernels,
        schedule: Scheduler::Program,
        align: 256,
        arena_bytes: arena,
        lower_bound_bytes: arena,
        weights_bytes: 0,
        inputs_bytes: 0,
        outputs_bytes: 0,
        workspace_bytes: 0,
        budget_bytes: 1 << 30,
        total_bytes: arena,
        strategy: Strategy::GreedySize,
        greedy_arena_bytes: arena,
        in_place: 0,
        aliases: 0,
        peak_step: 0,
        peak_live: Vec::new(),
        peak_scratch_bytes: 0,
        steps: (0..kernels)
            .map(|k| PlanStep {
                kernel: format!("k{k}_{name}"),
                kind: StepKind::Elementwise,
                args: Vec::new(),
                scratch: None,
            })
            .collect(),
        buffers,
        scratch: Vec::new(),
        time: Default::default(),
    }
}

#[test]
fn svg_escapes_names() {
    let nasty = "a<b&c\"d>'e";
    let plan = tiny_plan(
        nasty,
        1,
        vec![PlannedBuffer {
            buffer: BufferId(0),
            name: Some(nasty.into()),
            offset: 0,
            bytes: 1024,
            start: 0,
            end: 1,
            reuses: None,
        }],
    );
    let svg = report::svg(&Program::default(), &plan);
    check_xml(&svg);
    assert!(!svg.contains(nasty));
    assert!(svg.contains("a&lt;b&amp;c&quot;d&gt;&apos;e"), "{svg}");
    assert_eq!(svg.matches("<rect class=\"buffer\"").count(), 1);
}

#[test]
fn pictures_of_empty_and_one_kernel_arenas() {
    let empty = tiny_plan("x", 1, Vec::new());
    assert_eq!(
        report::picture(&empty, 40, 8),
        "arena empty: no intermediate lives in the arena (1 kernel)\n"
    );
    check_xml(&report::svg(&Program::default(), &empty));
    let none = tiny_plan("x", 0, Vec::new());
    assert!(report::picture(&none, 40, 8).contains("0 kernels"));

    let one = tiny_plan(
        "x",
        1,
        vec![
            PlannedBuffer {
                buffer: BufferId(3),
                name: Some("t".into()),
                offset: 0,
                bytes: 512,
                start: 0,
                end: 1,
                reuses: None,
            },
            PlannedBuffer {
                buffer: BufferId(4),
                name: None,
                offset: 512,
                bytes: 512,
                start: 0,
                end: 1,
                reuses: None,
            },
        ],
    );
    let pic = report::picture(&one, 10, 4);
    let rows: Vec<&str> = pic.lines().take(4).collect();
    assert!(rows[0].ends_with("|BBBBBBBBBB| < lower bound 1.00 KiB"), "{pic}");
    assert!(rows[3].ends_with("0 |AAAAAAAAAA|"), "{pic}");
    // Tiny plots and many steps per column still draw.
    assert!(report::picture(&one, 1, 1).contains('|'));
    let many = tiny_plan(
        "x",
        1000,
        vec![PlannedBuffer {
            buffer: BufferId(0),
            name: None,
            offset: 0,
            bytes: 256,
            start: 10,
            end: 900,
            reuses: None,
        }],
    );
    let pic = report::picture(&many, 50, 3);
    assert!(pic.contains("20 steps per column"), "{pic}");
    check_xml(&report::svg(&Program::default(), &many));
}

#[test]
fn human_bytes_and_budget_args() {
    assert_eq!(human_bytes(0), "0 B");
    assert_eq!(human_bytes(1023), "1023 B");
    assert_eq!(human_bytes(1536), "1.50 KiB");
    assert_eq!(human_bytes(24 << 30), "24.0 GiB");
    assert_eq!(report::budget_arg(24 << 30), "24GiB");
    assert_eq!(report::budget_arg(3 << 20), "3MiB");
    assert_eq!(report::budget_arg(1000), "1000");
}

#[test]
fn a_plan_that_fits_has_no_diagnosis() {
    let c = block();
    assert!(c.plan.fits());
    assert_eq!(over_budget_diagnosis(&c.program, &c.plan, &Rerun::default()), None);
    assert!(check_budget(&c.program, &c.plan, &Rerun::default()).is_ok());
    assert!(graphc::check_budget(&c, &Rerun::default()).is_ok());
}

#[test]
fn over_budget_says_by_how_much_what_is_live_and_what_would_help() {
    let fits = block();
    let fixed = fits.plan.weights_bytes + fits.plan.workspace_bytes;
    // Room for the weights and workspace, not for all the activations.
    let budget = fixed + (fits.plan.total_bytes - fixed) / 2;
    let c = with_budget(budget);
    assert!(!c.plan.fits());
    let dims = Rerun::dims(&["batch".to_string()]);
    let text = over_budget_diagnosis(&c.program, &c.plan, &dims).expect("over budget");
    let over = c.plan.total_bytes - budget;
    assert!(
        text.contains(&format!("over by {} ({over} B)", human_bytes(over))),
        "{text}"
    );
    assert!(
        text.contains(&format!("budget is {} ({budget} B)", human_bytes(budget))),
        "{text}"
    );
    for label in ["weights", "arena", "inputs", "outputs", "workspace", "total"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(label)),
            "{label} in {text}"
        );
    }
    let peak = &c.plan.steps[c.plan.peak_step as usize];
    assert!(
        text.contains(&format!("kernel {} ({})", peak.kernel, peak.kind)),
        "{text}"
    );
    let top = &c.plan.peak_live[0];
    assert!(text.contains(top.name.as_deref().unwrap()), "{text}");
    assert!(
        text.contains(&format!(
            "graphc fit MODEL --dim batch --budget {}",
            report::budget_arg(budget)
        )),
        "{text}"
    );
    assert!(text.contains("bf16/fp16"), "{text}");
    assert!(!text.contains("no activation remedy"), "{text}");

    let err = check_budget(&c.program, &c.plan, &dims).unwrap_err();
    assert_eq!(err.over_by, over);
    assert_eq!(err.to_string(), text.trim_end());
    assert!(matches!(
        graphc::check_budget(&c, &dims),
        Err(graphc::Error::OverBudget(_))
    ));
}

#[test]
fn weights_over_the_budget_rule_out_activation_remedies() {
    let c = with_budget(64 << 10);
    assert!(c.plan.weights_bytes > 64 << 10);
    let text = over_budget_diagnosis(&c.program, &c.plan, &Rerun::dims(&["batch".to_string()])).unwrap();
    assert!(text.contains("the weights alone"), "{text}");
    assert!(text.contains("no activation remedy"), "{text}");
    assert!(!text.contains("graphc fit"), "{text}");
    assert!(!text.contains("recomputation ("), "{text}");
}

#[test]
fn recomputation_names_tensors_idle_across_the_peak() {
    // Of the exported fixtures, those whose peak has an elementwise or row result made
    // earlier and read again only after the peak (Llama's and BERT's do).
    let mut found = 0;
    for name in ["gpt2", "bert", "llama", "vit", "idle norm"] {
        let graph = if name == "idle norm" {
            idle_norm_model()
        } else {
            fixture(name)
        };
        let fits = graphc::compile(&graph).unwrap();
        let fixed = fits.plan.weights_bytes + fits.plan.workspace_bytes;
        let opts = CompileOptions {
            memory: MemoryOptions {
                budget_bytes: fixed + (fits.plan.total_bytes - fixed) / 2,
                ..Default::default()
            },
            ..Default::default()
        };
        let c = graphc::compile_with(&graph, &opts).unwrap();
        let text = over_budget_diagnosis(&c.program, &c.plan, &Rerun::default()).unwrap();
        assert!(text.contains("a smaller batch or sequence length"), "{text}");
        let Some(line) = text.lines().find(|l| l.contains("recomputation (rematerialization)")) else {
            continue;
        };
        found += 1;
        // Every tensor it names was live at the peak, written by a cheap kernel, and not
        // touched at the peak step.
        let peak = c.plan.peak_step;
        let named: Vec<_> = c
            .plan
            .peak_live
            .iter()
            .filter(|t| line.contains(&format!("(b{}, ", t.buffer.0)))
            .collect();
        assert!(!named.is_empty(), "{name}: {line}");
        for t in named {
            assert!(matches!(t.op.as_str(), "elementwise" | "row"), "{name}: {line}");
            assert!(!c.plan.steps[peak as usize].args.iter().any(|a| a.buffer == t.buffer));
        }
    }
    assert!(found > 0, "no fixture's diagnosis offers recomputation");
}

/// A model compiled with `opts` and a budget halfway between its weights + workspace
/// and its total: over, with every activation remedy open.
fn half_over(graph: &graphc_ir::Graph, opts: &CompileOptions) -> Compiled {
    let fits = graphc::compile_with(graph, opts).unwrap();
    let fixed = fits.plan.weights_bytes + fits.plan.workspace_bytes;
    let mut opts = opts.clone();
    opts.memory.budget_bytes = fixed + (fits.plan.total_bytes - fixed) / 2;
    let c = graphc::compile_with(graph, &opts).unwrap();
    assert!(!c.plan.fits());
    c
}

fn bf16() -> CompileOptions {
    CompileOptions {
        precision: graphc_compiler::passes::precision::Precision::Bf16,
        ..Default::default()
    }
}

/// A norm whose result is read again after an MLP: a row result idle across the MLP's
/// peak, which recomputation would free. (The exported fixtures' attention is one
/// kernel now, and their peaks hold no such tensor.)
fn idle_norm_model() -> graphc_ir::Graph {
    use graphc_ir::{nn, DType, GraphBuilder, Tensor, TensorType};
    let (n, d) = (256, 64);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [n, d]);
    let w = |name: &str, r: usize, c: usize, seed: u64| {
        b.param(name, Tensor::randn(&TensorType::new(DType::F32, [r, c]), 0.1, seed))
    };
    let h = nn::layer_norm(x, None, None, 1e-5);
    let mixed = h.matmul(w("mix", d, d, 3));
    let up = mixed.matmul(w("up", d, 8 * d, 1)).relu();
    let down = up.matmul(w("down", 8 * d, d, 2));
    // h is read again only by the norm after the MLP, not by the peak's GEMM.
    b.output("y", nn::layer_norm(down, None, None, 1e-5) + h * 2.0);
    b.finish().unwrap()
}

fn fixture(name: &str) -> graphc_ir::Graph {
    graphc::load_model(
        &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/onnx/{name}/model.onnx")),
        &[],
    )
    .unwrap()
}

#[test]
fn a_bf16_model_is_not_told_to_use_bf16() {
    let c = half_over(&gpt(&GptConfig::default()).unwrap(), &bf16());
    let d = report::diagnose(&c.program, &c.plan, &Rerun::default()).unwrap();
    assert!(
        !d.remedies.iter().any(|r| matches!(r, Remedy::LowerPrecision(_))),
        "{:?}",
        d.remedies
    );
    let text = d.to_string();
    assert!(!text.contains("bf16/fp16 instead of f32"), "{text}");
    assert!(text.contains("a smaller batch or sequence length"), "{text}");
    // Weights over the budget can only shrink by quantization then.
    let mut opts = bf16();
    opts.memory.budget_bytes = 64 << 10;
    let tiny = graphc::compile_with(&gpt(&GptConfig::default()).unwrap(), &opts).unwrap();
    let text = over_budget_diagnosis(&tiny.program, &tiny.plan, &Rerun::default()).unwrap();
    assert!(text.contains("the weights alone"), "{text}");
    assert!(text.contains("must shrink (quantization)"), "{text}");
    assert!(!text.contains("bf16/fp16"), "{text}");
    // The f32 model is offered it.
    let f32 = half_over(&gpt(&GptConfig::default()).unwrap(), &Default::default());
    let d = report::diagnose(&f32.program, &f32.plan, &Rerun::default()).unwrap();
    assert!(d.remedies.iter().any(|r| matches!(r, Remedy::LowerPrecision(_))));
}

#[test]
fn weights_are_labelled_by_their_real_dtypes() {
    // After a bf16 compile most weights are bf16: the breakdown says so, by dtype, and
    // the dtypes add up to the weights row.
    let c = half_over(&gpt(&GptConfig::default()).unwrap(), &bf16());
    let d = report::diagnose(&c.program, &c.plan, &Rerun::default()).unwrap();
    let by = &d.breakdown.weights_by_dtype;
    assert_eq!(by.iter().map(|x| x.bytes).sum::<u64>(), c.plan.weights_bytes);
    assert_eq!(by[0].dtype, graphc_ir::DType::BF16, "{by:?}");
    let text = d.to_string();
    let row = text.lines().find(|l| l.trim_start().starts_with("weights")).unwrap();
    assert!(row.contains(&format!("bf16 {}", human_bytes(by[0].bytes))), "{row}");
    assert!(!text.contains("f32 weights"), "{text}");

    // An f32 model: the precision remedy gives the f32 weights out of all of them.
    let c = half_over(&gpt(&GptConfig::default()).unwrap(), &Default::default());
    let d = report::diagnose(&c.program, &c.plan, &Rerun::default()).unwrap();
    let Some(Remedy::LowerPrecision(p)) = d.remedies.iter().find(|r| matches!(r, Remedy::LowerPrecision(_))) else {
        panic!("{:?}", d.remedies)
    };
    assert_eq!(p.weights_bytes, c.plan.weights_bytes);
    let text = d.to_string();
    assert!(
        text.contains(&format!(
            "weights in f32 {} of {}",
            human_bytes(p.f32_weights_bytes),
            human_bytes(c.plan.weights_bytes)
        )),
        "{text}"
    );
    let row = text.lines().find(|l| l.trim_start().starts_with("weights")).unwrap();
    // Every weight of the block is f32 (its causal mask is no constant: attention is
    // causal), so the row says so.
    assert_eq!(p.f32_weights_bytes, c.plan.weights_bytes);
    assert!(row.contains("all f32"), "{row}");
}

/// The peak table's rows of a diagnosis: from the `peak:` line to `what would help:`.
fn peak_rows(text: &str) -> Vec<&str> {
    text.lines()
        .skip_while(|l| !l.starts_with("peak: "))
        .skip(1)
        .take_while(|l| !l.starts_with("what would help") && !l.starts_with("  and "))
        .collect()
}

#[test]
fn the_recomputation_line_uses_the_peak_tables_bytes() {
    let mut found = 0;
    for name in ["bert", "llama", "gpt2", "vit", "idle norm"] {
        let graph = if name == "idle norm" {
            idle_norm_model()
        } else {
            fixture(name)
        };
        let c = half_over(&graph, &Default::default());
        let d = report::diagnose(&c.program, &c.plan, &Rerun::default()).unwrap();
        let Some(Remedy::Recompute(r)) = d.remedies.iter().find(|r| matches!(r, Remedy::Recompute(_))) else {
            continue;
        };
        found += 1;
        let text = d.to_string();
        let rows = peak_rows(&text);
        let line = text.lines().find(|l| l.contains("recomputation (")).unwrap();
        for t in r.tensors.iter().take(5) {
            let live = c.plan.peak_live.iter().find(|x| x.buffer == t.buffer).unwrap();
            assert_eq!(t.bytes, live.bytes, "{name}");
            assert_eq!(t.frees_bytes + t.kept_bytes, t.bytes, "{name}");
            let tag = format!("b{}", t.buffer.0);
            if let Some(row) = rows.iter().find(|l| l.split_whitespace().any(|w| w == tag)) {
                assert!(row.contains(&human_bytes(t.bytes)), "{name}: {row} / {line}");
            }
            assert!(
                line.contains(&format!("({tag}, {} by", human_bytes(t.bytes))),
                "{name}: {line}"
            );
        }
        let frees: u64 = r.tensors.iter().map(|t| t.frees_bytes).sum();
        assert_eq!(r.frees_bytes, frees);
        assert!(
            line.contains(&format!("frees about {} at the peak", human_bytes(frees))),
            "{line}"
        );
    }
    assert!(found > 0, "no fixture's diagnosis offers recomputation");
}

#[test]
fn the_live_count_agrees_with_the_peak_table() {
    {
        let c = half_over(&common::scratch_epilogue_model(), &Default::default());
        let plan = &c.plan;
        assert!(plan.peak_scratch_bytes > 0, "a peak with GEMM scratch");
        let n = plan.peak_live.len();
        let words = format!(
            "{n} tensors and {} of GEMM scratch live",
            human_bytes(plan.peak_scratch_bytes)
        );
        let text = over_budget_diagnosis(&c.program, plan, &Rerun::default()).unwrap();
        assert!(text.contains(&words), "{text}");
        // One row per tensor (up to 8) and one for the scratch.
        assert_eq!(peak_rows(&text).len(), n.min(8) + 1, "{text}");
        let summary = report::summary(&c.program, plan);
        assert!(summary.contains(&words), "{summary}");
        let table: Vec<&str> = summary
            .lines()
            .skip_while(|l| !l.starts_with("tensors live at the peak"))
            .skip(2)
            .take_while(|l| l.starts_with("  ") && !l.starts_with("  and "))
            .collect();
        assert_eq!(table.len(), n.min(10) + 1, "{summary}");
    }
}

#[test]
fn the_plan_pass_says_the_lower_bound_adds_the_gemm_scratch() {
    let c = graphc::compile(&common::scratch_epilogue_model()).unwrap();
    let scratch = c.plan.peak_scratch_bytes;
    assert!(scratch > 0);
    // The schedule's peak counts tensors only; the lower bound is the peak step's
    // tensors plus its scratch, which here outweighs the tensor-only peak.
    let live: u64 = c.plan.peak_live.iter().map(|t| t.bytes).sum();
    assert_eq!(c.plan.lower_bound_bytes, live + scratch);
    assert!(c.schedule.peak < c.plan.lower_bound_bytes);
    let plan = c.passes.iter().find(|p| p.pass.name() == "plan").unwrap().to_string();
    assert!(
        plan.contains(&format!(
            "the lower bound includes the {scratch} bytes of GEMM scratch live at step {}",
            c.plan.peak_step
        )),
        "{plan}"
    );
    let summary = report::summary(&c.program, &c.plan);
    assert!(
        summary.contains(&format!(
            "most arena bytes live at once, {} of it GEMM scratch",
            human_bytes(scratch)
        )),
        "{summary}"
    );
}

#[test]
fn a_cpu_run_needs_no_cublaslt_workspace() {
    let c = block();
    let p = &c.plan;
    assert!(p.workspace_bytes > 0);
    assert_eq!(p.total_bytes_for(Device::Cuda), p.total_bytes);
    assert_eq!(p.total_bytes_for(Device::Cpu), p.total_bytes - p.workspace_bytes);
    let cpu = report::summary_for(&c.program, p, Device::Cpu);
    assert!(cpu.contains("none on the CPU"), "{cpu}");
    let total = p.total_bytes_for(Device::Cpu);
    let row = cpu.lines().find(|l| l.starts_with("total")).unwrap();
    assert!(row.contains(&format!(" {total} B")), "{row}");
    assert_eq!(
        report::summary_for(&c.program, p, Device::Cuda),
        report::summary(&c.program, p)
    );
    // A budget between the two totals fits on the CPU only.
    let c = with_budget(total + 1024);
    assert!(!c.plan.fits() && c.plan.fits_on(Device::Cpu));
    let json = serde_json::to_value(PlanJson::new(&c.program, &c.plan, Device::Cpu, &Rerun::default())).unwrap();
    assert_eq!(json["summary"]["fits"], true);
    assert_eq!(json["summary"]["total_bytes"], total);
    assert!(json.get("diagnosis").is_none());
    assert!(check_budget_for(&c.program, &c.plan, &Rerun::default(), Device::Cpu).is_ok());
    assert!(check_budget(&c.program, &c.plan, &Rerun::default()).is_err());
    // Below the CPU's total: its diagnosis counts no workspace.
    let small = with_budget(total / 2);
    let d = report::diagnose_for(&small.program, &small.plan, &Rerun::default(), Device::Cpu).unwrap();
    assert_eq!(d.total_bytes, total);
    assert_eq!(d.over_by, total - total / 2);
    assert_eq!(d.breakdown.workspace_bytes, 0);
    assert!(!d.to_string().contains("cuBLASLt"), "{d}");
    let err = check_budget_for(&small.program, &small.plan, &Rerun::default(), Device::Cpu).unwrap_err();
    assert_eq!((err.total_bytes, err.diagnosis), (total, d.to_string()));
}

#[test]
fn the_plan_json_keeps_the_plans_fields_and_adds_a_summary_and_the_diagnosis() {
    let c = block();
    let plan = serde_json::to_value(&c.plan).unwrap();
    // The enums serialize as the strings they replaced.
    assert_eq!(plan["schedule"], "program");
    assert_eq!(plan["strategy"], "greedy:size");
    assert_eq!(plan["arch"], "sm_89");
    let kinds: Vec<&str> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "row",
            "matmul",
            "attention",
            "elementwise",
            "matmul",
            "row",
            "matmul",
            "matmul"
        ]
    );
    assert!(plan["buffers"][0]["buffer"].is_u64());
    let round: MemoryPlan = serde_json::from_value(plan.clone()).unwrap();
    assert_eq!(serde_json::to_value(&round).unwrap(), plan);

    let json = serde_json::to_value(PlanJson::new(&c.program, &c.plan, Device::Cuda, &Rerun::default())).unwrap();
    for (k, v) in plan.as_object().unwrap() {
        assert_eq!(&json[k], v, "{k}");
    }
    assert_eq!(json["summary"]["fits"], true);
    assert_eq!(json["summary"]["total_bytes"], c.plan.total_bytes);
    assert!(json.get("diagnosis").is_none());

    let over = half_over(&gpt(&GptConfig::default()).unwrap(), &Default::default());
    let dims = Rerun::dims(&["batch".to_string()]);
    let json = serde_json::to_value(PlanJson::new(&over.program, &over.plan, Device::Cuda, &dims)).unwrap();
    let d = &json["diagnosis"];
    assert_eq!(d["over_by"], over.plan.total_bytes - over.plan.budget_bytes);
    assert_eq!(d["peak"]["step"], over.plan.peak_step);
    let remedies: Vec<&str> = d["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["remedy"].as_str().unwrap())
        .collect();
    assert!(
        remedies.contains(&"smaller_dim") && remedies.contains(&"lower_precision"),
        "{remedies:?}"
    );
    assert_eq!(d["remedies"][0]["dim"], "batch");
    // The text is rendered from the same value.
    let err = check_budget(&over.program, &over.plan, &dims).unwrap_err();
    assert_eq!(err.details.text(&dims), err.diagnosis);
    assert_eq!(serde_json::to_value(&*err.details).unwrap(), *d);
}

#[test]
fn the_library_checks_a_cpu_budget_without_the_workspace() {
    let c = block();
    let cpu = c.plan.total_bytes_for(Device::Cpu);
    let c = with_budget(cpu);
    assert!(graphc::check_budget(&c, &Rerun::default()).is_err());
    assert!(graphc::check_budget_on(&c, &Rerun::default(), Device::Cpu).is_ok());
    assert!(matches!(
        graphc::check_budget_on(&c, &Rerun::default(), Device::Cuda),
        Err(graphc::Error::OverBudget(_))
    ));
}

/// The summary names the attention kernels and the score bytes they never store:
/// the block's one causal attention over [2, 4, 16, 16] f32 scores, 8 KiB; GPT-2's two.
#[test]
fn the_summary_counts_attention_kernels_and_the_scores_they_never_store() {
    let c = block();
    let text = report::summary(&c.program, &c.plan);
    assert!(
        text.contains(
            "attention      1 kernel, fused: the score matrices are never stored (stored, they would take \
             8.00 KiB, summed over the kernels)"
        ),
        "{text}"
    );
    let g = fixture("gpt2");
    let c = graphc::compile(&g).unwrap();
    assert_eq!(report::attention_savings(&c.program), (2, 2 * 2 * 4 * 16 * 16 * 4));
    // No attention, no row.
    let mlp = graphc::compile(&graphc::models::mlp(&Default::default()).unwrap()).unwrap();
    assert!(!report::summary(&mlp.program, &mlp.plan).contains("attention"));
}
