//! `graphc fit`: the largest value of one symbolic dimension whose memory plan fits
//! the budget, the probes that found it, and the plan there.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use graphc::fit::ProbeCompiles;
use graphc_compiler::pipeline::family;
use graphc_compiler::plan::report;

use crate::args::{parse_dim_spec, BudgetArgs};
use crate::common::{human_bytes, Progress};

#[derive(clap::Args)]
pub struct FitArgs {
    /// The model: an .onnx file with symbolic input dimensions.
    pub model: PathBuf,
    /// The dimension to search: NAME; other symbolic dimensions fixed: NAME=N.
    #[arg(long = "dim", value_name = "NAME[=N]", value_parser = parse_dim_spec, required = true)]
    pub dims: Vec<(String, Option<usize>)>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Search no higher than this.
    #[arg(long, default_value_t = 1 << 20)]
    pub max: usize,
    /// Fit a whole training step (forward, loss, backward, optimizer update), with the
    /// options `graphc train` takes; the plan's bytes by class at the value found and
    /// what grows at the next.
    #[arg(long)]
    pub train: bool,
    #[command(flatten)]
    pub train_opts: crate::train::TrainArgs,
    /// Also model the time of the answer's kernels on a GPU (`--gpu`), as `plan --time`
    /// does, and the throughput it gives: the searched dimension per second.
    #[arg(long)]
    pub time: bool,
    /// The GPU `--time` models: rtx4090d (the default) or h200.
    #[arg(long, value_name = "NAME", default_value = "rtx4090d", requires = "time")]
    pub gpu: String,
}

pub fn run(args: FitArgs) -> Result<()> {
    let FitArgs {
        model,
        dims,
        budget,
        max,
        train,
        train_opts,
        time,
        gpu,
    } = args;
    if time {
        graphc::perf::GpuSpec::by_name(&gpu).map_err(|e| anyhow::anyhow!(e))?;
    }
    let searched: Vec<&str> = dims
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    let [dim] = searched[..] else {
        bail!(
            "give exactly one --dim NAME to search (and NAME=N for the others); got {}",
            if searched.is_empty() {
                "none".to_string()
            } else {
                searched.join(", ")
            }
        );
    };
    let fixed: Vec<(String, usize)> = dims.iter().filter_map(|(n, v)| v.map(|v| (n.clone(), v))).collect();
    let start = Instant::now();
    let progress = Progress::new(format!("fitting {dim}"));
    let mut probes = 0;
    let mut opts = budget.options();
    if train {
        opts.train = Some(train_opts.options_to_plan(budget.precision)?);
    }
    // With `--remat auto`, the library also runs the search without recomputation
    // (on the other core): `fit.without`.
    let fit = graphc::fit::fit_model_with(&model, &fixed, dim, &opts, max, &mut |value| {
        probes += 1;
        progress.set(format!("fitting {dim}: probe {probes}, {dim}={value}"));
    });
    let fit = match fit {
        // The remedies as changes of this command.
        Err(graphc::Error::DoesNotFit { value, diagnosis, .. }) => {
            let rerun = graphc::Rerun {
                command: Some(crate::hint::command_line()),
                model: model.to_string_lossy().into_owned(),
                dims: Vec::new(),
                fit_options: {
                    let mut w = budget.words();
                    if train {
                        w.extend(train_opts.words());
                    }
                    w
                },
            };
            bail!("even {dim}={value} does not fit: {}", diagnosis.text(&rerun).trim_end())
        }
        other => other?,
    };
    let searched_in = start.elapsed();
    drop(progress);
    println!(
        "fit          {dim} = {} is the largest that fits {}{}",
        fit.value,
        human_bytes(budget.budget),
        beyond(&fit, dim, budget.budget, max)
    );
    let tried: Vec<String> = fit
        .probes
        .iter()
        .map(|p| match p.total_bytes {
            Some(t) => format!("{}: {}{}", p.value, human_bytes(t), if p.fits { "" } else { " (over)" }),
            None => format!("{}: error", p.value),
        })
        .collect();
    println!(
        "probes       {} in {:.0} ms: {}",
        fit.probes.len(),
        searched_in.as_secs_f64() * 1e3,
        tried.join(", ")
    );
    println!("compiles     {}", compiles(&fit.compiles, dim, train));
    if let Some(n) = opts.train.as_ref().map(|t| t.accumulate).filter(|&n| n > 1) {
        println!(
            "accumulate   {dim} = {} is the microbatch: {n} of them make one update's batch of {} (the gradients' sums held between)",
            fit.value,
            fit.value.saturating_mul(n)
        );
    }
    if let Some(without) = &fit.without {
        let off = match without {
            Ok(v) => format!("{dim} = {v}"),
            Err(e) => match e.as_ref() {
                graphc::Error::DoesNotFit { value, .. } => format!("even {dim}={value} does not fit"),
                e => format!("{e}"),
            },
        };
        println!("remat        off:  {off}");
        let auto = match fit.compiled.train.as_ref().and_then(|t| t.report.recomputed_layers) {
            Some(r) => format!("{dim} = {}: {}", fit.value, r.text()),
            None => format!("{dim} = {}: nothing made again (the step fits without)", fit.value),
        };
        println!("             auto: {auto}");
        if let Some(p) = fit.compiled.train.as_ref().and_then(|t| t.report.recomputed_logits) {
            println!("                   and {}", p.text());
        }
        if let Some(m) = fit
            .compiled
            .train
            .as_ref()
            .map(|t| t.report.mlp_parts)
            .filter(|m| m.any())
        {
            println!(
                "                   and {}, in the forward and the backward",
                m.summary()
            );
        }
    }
    if time {
        let progress = Progress::new("counting kernels on cuda-sim");
        let t = graphc::model_time(&fit.compiled, &gpu, &graphc::cuda::sim::SimOptions::default())?;
        drop(progress);
        let what = if train { "a training step" } else { "a run" };
        let rate = fit.value as f64 / t.modeled_s.max(1e-12);
        println!(
            "throughput   {dim} = {} in {what} of {:.3} ms modeled on {gpu}: {} {dim} per second",
            fit.value,
            t.modeled_s * 1e3,
            if rate >= 100.0 {
                format!("{rate:.0}")
            } else {
                format!("{rate:.1}")
            }
        );
        println!();
        print!("{}", t.text(12));
    }
    println!();
    print!("{}", report::summary(&fit.compiled.program, &fit.compiled.plan));
    if let Some(t) = &fit.compiled.train {
        let planned = graphc_compiler::plan::Device::Cuda;
        let at = report::TrainBytes::of(&fit.compiled.program, &fit.compiled.plan, &t.state, planned);
        println!();
        print!("{}", at.text());
        // What grows: the same classes at the first value over.
        if let Some(over) = fit.first_over().filter(|p| p.total_bytes.is_some()) {
            // The plan the search made there, else made now.
            let made;
            let next = match &fit.over {
                Some(c) => c,
                None => {
                    let mut dims = fixed.clone();
                    dims.push((dim.to_string(), over.value));
                    let graph = graphc::load_model(&model, &dims)?;
                    let mut o = opts.clone();
                    if let Some(tr) = &mut o.train {
                        tr.target = graphc::train::expected_target(&graph, tr)?;
                    }
                    made = graphc::compile_with(&graph, &o)?;
                    &made
                }
            };
            if let Some(nt) = &next.train {
                let nb = report::TrainBytes::of(&next.program, &next.plan, &nt.state, planned);
                println!();
                print!(
                    "{}",
                    at.growth_text(&nb, &format!("{dim}={}", fit.value), &format!("{dim}={}", over.value))
                );
            }
        }
    }
    Ok(())
}

/// How the probes were compiled: once per shape family, or each (and why).
fn compiles(how: &ProbeCompiles, dim: &str, train: bool) -> String {
    match how {
        ProbeCompiles::Family { integers } if train => format!(
            "one shape family of the step: imported, differentiated and optimized at {dim}={} and {dim}={}; \
             the probes set {integers} integers of the step graph, then chose what to recompute, fused and planned",
            family::LOW,
            family::MARKER
        ),
        ProbeCompiles::Family { integers } => format!(
            "one shape family: imported and optimized at {dim}=1, {dim}={} and {dim}={}; \
             the other probes set {integers} integers of the optimized graph, then fused and planned",
            family::LOW,
            family::MARKER
        ),
        ProbeCompiles::Each => "each probe imported and optimized".to_string(),
        ProbeCompiles::EachBecause(why) => format!("each probe imported and optimized: no shape family ({why})"),
    }
}

/// What lies past the value found: the first value over, the cap, or where the
/// search stopped.
fn beyond(fit: &graphc::fit::Fit, dim: &str, budget: u64, max: usize) -> String {
    let over = match fit.first_over() {
        Some(p) => match (p.total_bytes, &p.error) {
            (Some(t), _) => format!(
                "; {dim}={} needs {} (over by {})",
                p.value,
                human_bytes(t),
                human_bytes(t.saturating_sub(budget))
            ),
            (None, Some(e)) => format!("; {dim}={} cannot be planned: {e}", p.value),
            _ => String::new(),
        },
        None if fit.capped => format!("; stopped at --max {max}"),
        None => String::new(),
    };
    if fit.exhausted {
        format!(
            "{over}; the search stopped after {} probes, so the largest is at least that{}",
            fit.probes.len(),
            fit.first_over()
                .map(|p| format!(" and below {}", p.value))
                .unwrap_or_default()
        )
    } else {
        over
    }
}
