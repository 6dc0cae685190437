//! `graphc train`: compile a whole training step (parameters as state, the loss, its
//! gradients, the optimizer's update) and run it `--steps` times on one batch,
//! printing `step N loss X` (the loss before step N's update); `--output` writes every
//! trainable parameter after the last step under its model name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use graphc::ir::{Graph, Tensor};
use graphc::train::{AdamW, Loss, LossKind, LossScaling, Optimizer, Sgd, TrainOptions};
use graphc_compiler::passes::precision::Precision;

use crate::args::{BudgetArgs, Device, DeviceArgs, ModelArgs};

/// What a training step computes (shared by `train` and `plan --train`).
#[derive(clap::Args, Clone)]
pub struct TrainArgs {
    /// The loss: `mse` (mean squared error against --target) or `cross-entropy` (over
    /// the last axis of the logits, integer labels in --target).
    #[arg(long, value_enum)]
    pub loss: Option<LossArg>,
    /// The array of --inputs holding the targets (mse) or labels (cross-entropy).
    #[arg(long, value_name = "NAME")]
    pub target: Option<String>,
    /// Cross-entropy: predict token t+1 at position t (logits[:, :-1] against
    /// labels[:, 1:]), as Hugging Face's causal-LM loss.
    #[arg(long)]
    pub shift_labels: bool,
    /// Cross-entropy: labels equal to this are not counted.
    #[arg(long, default_value_t = -100, allow_negative_numbers = true)]
    pub ignore_index: i64,
    /// The optimizer, with PyTorch's semantics and defaults.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Adamw)]
    pub optimizer: OptimizerArg,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// SGD: momentum.
    #[arg(long, default_value_t = 0.0)]
    pub momentum: f64,
    /// SGD: dampening of the momentum.
    #[arg(long, default_value_t = 0.0)]
    pub dampening: f64,
    /// SGD: Nesterov momentum.
    #[arg(long)]
    pub nesterov: bool,
    /// Weight decay (default: 0 for SGD, 0.01 decoupled for AdamW).
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// AdamW: B1,B2.
    #[arg(long, value_name = "B1,B2", value_parser = parse_betas, default_value = "0.9,0.999")]
    pub betas: (f64, f64),
    /// AdamW: eps (added outside the square root).
    #[arg(long, default_value_t = 1e-8)]
    pub eps: f64,
    /// Parameters whose name this regular expression matches are not trained.
    #[arg(long, value_name = "REGEX")]
    pub freeze: Option<String>,
    /// The model output the loss reads (default: the first).
    #[arg(long = "loss-output", value_name = "NAME")]
    pub loss_output: Option<String>,
    /// Loss scaling: `dynamic` (torch.amp.GradScaler: the default with --precision
    /// fp16) or `none` (the default otherwise; bf16 has f32's range and needs none).
    #[arg(long, value_enum)]
    pub loss_scale: Option<LossScaleArg>,
    /// Dynamic loss scaling: the initial scale.
    #[arg(long, default_value_t = 65536.0)]
    pub init_scale: f64,
    /// Dynamic loss scaling: consecutive finite steps before the scale doubles.
    #[arg(long, default_value_t = 2000)]
    pub growth_interval: u32,
    /// Recomputation: `off` (keep what the backward reads; cheap elementwise values are
    /// still made again), `full` (keep only each layer's input and compute the layer
    /// again in its backward, as `gradient_checkpointing_enable()`; layers are found by
    /// their parameters' names, `h.N`, `layers.N`, `layer.N`, `blocks.N`) or `auto`
    /// (none when the step fits the budget, else the fewest layers, the first ones,
    /// made again as `full` does for it to fit).
    #[arg(long, value_enum, default_value_t = RematArg::Auto)]
    pub remat: RematArg,
    /// Gradient accumulation: sum the gradients of this many microbatches before one
    /// optimizer update (`graphc train` splits the batch's first dim into them; `plan`
    /// and `fit` take the model's batch dim as the microbatch).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub accumulate: usize,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum RematArg {
    Off,
    Auto,
    Full,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum LossScaleArg {
    Dynamic,
    None,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum LossArg {
    Mse,
    CrossEntropy,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerArg {
    Sgd,
    Adamw,
}

fn parse_betas(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s.split_once(',').ok_or("expected B1,B2")?;
    let p = |x: &str| x.trim().parse::<f64>().map_err(|e| format!("{x:?}: {e}"));
    Ok((p(a)?, p(b)?))
}

/// `--train` and the step's options, for the commands that print a compiled program
/// (`graphc cuda`, `graphc ptx`).
#[derive(clap::Args)]
pub struct StepArgs {
    /// The kernels of the whole training step (forward, loss, backward, optimizer
    /// update: the options as `graphc train` takes them) instead of the model's.
    #[arg(long)]
    pub train: bool,
    #[command(flatten)]
    pub opts: TrainArgs,
    /// Compute precision: fp32, tf32, bf16 or fp16 (mixed: low-precision storage and
    /// compute, f32 where it matters; a training step keeps f32 master parameters).
    #[arg(long, default_value = "fp32")]
    pub precision: Precision,
    /// As `graphc plan --chunk-tokens`: the MLPs (inference) or a training step's LM
    /// head and loss over this many parts, so the kernels printed are those that run.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub chunk_tokens: Option<u16>,
    /// As `graphc plan --chunk-mlps`: a training step's MLPs over this many parts of
    /// their tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub chunk_mlps: Option<u16>,
}

impl StepArgs {
    /// The model compiled with default options and `--precision`, or its training
    /// step with `--train`.
    pub fn compile(&self, graph: &Graph) -> Result<graphc::Compiled> {
        let base = graphc::CompileOptions {
            precision: self.precision,
            token_chunks: self.chunk_tokens.map_or(0, usize::from),
            mlp_chunks: self.chunk_mlps.map_or(0, usize::from),
            ..Default::default()
        };
        Ok(if self.train {
            graphc::train::compile_step(graph, self.opts.options_for(graph, self.precision)?, &base)?
        } else {
            graphc::compile_with(graph, &base)?
        })
    }
}

impl TrainArgs {
    /// The step's options, the target's type as the loss expects it from the model's
    /// output (mse: the output's type; cross-entropy: i64 labels of its leading dims).
    pub fn options_for(&self, graph: &Graph, precision: Precision) -> Result<TrainOptions> {
        let mut opts = self.options_to_plan(precision)?;
        opts.target = graphc::train::expected_target(graph, &opts)?;
        Ok(opts)
    }

    /// The step's options for planning at several shapes (`graphc fit --train`): the
    /// target's type is set at each (`graphc::train::expected_target`).
    pub fn options_to_plan(&self, precision: Precision) -> Result<TrainOptions> {
        self.options_of(graphc::ir::TensorType::new(graphc::ir::DType::I64, vec![]), precision)
    }

    /// The step's options, the target's type taken from `target`.
    pub fn options(&self, target: &Tensor, precision: Precision) -> Result<TrainOptions> {
        self.options_of(target.ty(), precision)
    }

    /// `--train` and these options as words, for the commands a report proposes
    /// (`graphc fit ... --train ...`).
    pub fn words(&self) -> Vec<String> {
        let mut w = vec!["--train".to_string()];
        let mut put = |flag: &str, value: String| {
            w.push(flag.to_string());
            w.push(value);
        };
        if let Some(l) = self.loss {
            put(
                "--loss",
                match l {
                    LossArg::Mse => "mse",
                    LossArg::CrossEntropy => "cross-entropy",
                }
                .into(),
            );
        }
        if let Some(t) = &self.target {
            put("--target", t.clone());
        }
        if self.ignore_index != -100 {
            put("--ignore-index", self.ignore_index.to_string());
        }
        put(
            "--optimizer",
            match self.optimizer {
                OptimizerArg::Sgd => "sgd",
                OptimizerArg::Adamw => "adamw",
            }
            .into(),
        );
        if let Some(f) = &self.freeze {
            put("--freeze", f.clone());
        }
        if let Some(o) = &self.loss_output {
            put("--loss-output", o.clone());
        }
        if let Some(s) = self.loss_scale {
            put(
                "--loss-scale",
                match s {
                    LossScaleArg::Dynamic => "dynamic",
                    LossScaleArg::None => "none",
                }
                .into(),
            );
        }
        if self.shift_labels {
            w.push("--shift-labels".into());
        }
        if self.accumulate > 1 {
            w.extend(["--accumulate".into(), self.accumulate.to_string()]);
        }
        match self.remat {
            RematArg::Auto => {}
            RematArg::Off => w.extend(["--remat".into(), "off".into()]),
            RematArg::Full => w.extend(["--remat".into(), "full".into()]),
        }
        w
    }

    /// Dynamic loss scaling as asked for, by default with fp16 only.
    fn loss_scaling(&self, precision: Precision) -> Option<LossScaling> {
        let dynamic = match self.loss_scale {
            Some(LossScaleArg::Dynamic) => true,
            Some(LossScaleArg::None) => false,
            None => precision == Precision::Fp16,
        };
        dynamic.then(|| LossScaling {
            init_scale: self.init_scale,
            growth_interval: self.growth_interval,
            ..LossScaling::default()
        })
    }

    fn options_of(&self, target: graphc::ir::TensorType, precision: Precision) -> Result<TrainOptions> {
        let Some(loss) = self.loss else {
            bail!("a training step needs --loss mse|cross-entropy");
        };
        // Planning without a batch: the target is an input named as --target says, or
        // `labels` / `target`.
        let name = self.target.clone().unwrap_or_else(|| match loss {
            LossArg::CrossEntropy => "labels".into(),
            LossArg::Mse => "target".into(),
        });
        let kind = match loss {
            LossArg::Mse => LossKind::Mse,
            LossArg::CrossEntropy => LossKind::CrossEntropy,
        };
        let optimizer = match self.optimizer {
            OptimizerArg::Sgd => Optimizer::Sgd(Sgd {
                lr: self.lr,
                momentum: self.momentum,
                dampening: self.dampening,
                weight_decay: self.weight_decay.unwrap_or(0.0),
                nesterov: self.nesterov,
            }),
            OptimizerArg::Adamw => Optimizer::AdamW(AdamW {
                lr: self.lr,
                betas: self.betas,
                eps: self.eps,
                weight_decay: self.weight_decay.unwrap_or(1e-2),
            }),
        };
        Ok(TrainOptions {
            loss: Loss {
                kind,
                target: name,
                ignore_index: self.ignore_index,
                shift_labels: self.shift_labels,
            },
            optimizer,
            freeze: self.freeze.clone(),
            target,
            output: self.loss_output.clone(),
            loss_scale: self.loss_scaling(precision),
            remat: match self.remat {
                RematArg::Off => graphc::train::Remat::Off,
                RematArg::Auto => graphc::train::Remat::Auto,
                RematArg::Full => graphc::train::Remat::Full,
            },
            accumulate: self.accumulate,
        })
    }
}

#[derive(clap::Args)]
pub struct TrainCmdArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The batch: one array per model input, by name, and the --target array.
    #[arg(long, value_name = "IN.npz")]
    pub inputs: PathBuf,
    #[command(flatten)]
    pub train: TrainArgs,
    /// Steps to run (each on the same batch).
    #[arg(long, default_value_t = 1)]
    pub steps: u64,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Write every trainable parameter after the last step here (.npz, by model name).
    #[arg(long, value_name = "OUT.npz")]
    pub output: Option<PathBuf>,
    /// On the GPU: after the steps, time every launch of the step (the median of 5
    /// more steps on the same batch, launched one by one; the state is put back after
    /// them) and print where the step's time goes, by kind of kernel and by launch.
    #[arg(long)]
    pub per_kernel: bool,
    /// With `--per-kernel`, also write every launch's timing as JSON (`step`, `name`,
    /// `kind`, `median_ms`): what `bench/train_check.py` sets beside the performance
    /// model's prediction (`graphc plan --time --json`).
    #[arg(long, value_name = "FILE", requires = "per_kernel")]
    pub per_kernel_json: Option<PathBuf>,
}

/// The batch of `path` split into the model's inputs and the target.
pub fn read_batch(path: &Path, graph: &Graph, target: Option<&str>) -> Result<(HashMap<String, Tensor>, Tensor)> {
    let arrays = graphc::npz::read_arrays(path).with_context(|| format!("reading {}", path.display()))?;
    check_batch(path, arrays, graph, target)
}

/// The microbatches of the batch in `path` for `--accumulate n`: every array split
/// along its first dim into `n` equal parts, in order, each checked against the model.
pub fn read_microbatches(
    path: &Path,
    graph: &Graph,
    target: Option<&str>,
    n: usize,
) -> Result<Vec<(HashMap<String, Tensor>, Tensor)>> {
    let arrays = graphc::npz::read_arrays(path).with_context(|| format!("reading {}", path.display()))?;
    let mut parts: Vec<Vec<(String, Tensor)>> = vec![Vec::new(); n];
    for (name, t) in arrays {
        let dims = t.shape().dims().to_vec();
        let Some(&rows) = dims.first() else {
            bail!(
                "{}: \"{name}\" is a scalar: --accumulate {n} splits each array's first dim",
                path.display()
            );
        };
        if rows % n != 0 {
            bail!(
                "{}: \"{name}\" has {rows} rows along its first dim, which --accumulate {n} cannot split into equal microbatches",
                path.display()
            );
        }
        let micro: Vec<usize> = std::iter::once(rows / n).chain(dims.iter().skip(1).copied()).collect();
        let bytes = t.le_bytes();
        let per = bytes.len() / n;
        let numel = t.numel() / n;
        for ((k, part), chunk) in parts.iter_mut().enumerate().zip(bytes.chunks_exact(per.max(1))) {
            let data = graphc::ir::TensorData::from_le_bytes(t.dtype(), chunk, numel)
                .with_context(|| format!("{}: \"{name}\": microbatch {k}", path.display()))?;
            part.push((name.clone(), Tensor::new(micro.clone(), data)?));
        }
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(k, arrays)| {
            check_batch(path, arrays, graph, target).with_context(|| format!("microbatch {} of {n}", k + 1))
        })
        .collect()
}

/// The model's inputs and the target among `arrays` (from `path`), each of the type
/// the model takes.
fn check_batch(
    path: &Path,
    arrays: Vec<(String, Tensor)>,
    graph: &Graph,
    target: Option<&str>,
) -> Result<(HashMap<String, Tensor>, Tensor)> {
    let Some(target) = target else {
        bail!("a training step needs --target NAME (an array of --inputs)");
    };
    let mut batch = HashMap::new();
    let mut tgt = None;
    let inputs: HashMap<&str, _> = graph
        .inputs()
        .iter()
        .filter_map(|&i| match &graph.node(i).op {
            graphc::ir::Op::Input { name, ty } => Some((name.as_str(), ty.clone())),
            _ => None,
        })
        .collect();
    for (name, t) in arrays {
        if name == target {
            tgt = Some(t);
        } else if let Some(ty) = inputs.get(name.as_str()) {
            if &t.ty() != ty {
                bail!("{}: input \"{name}\" should be {ty}, got {}", path.display(), t.ty());
            }
            batch.insert(name, t);
        } else {
            bail!(
                "{}: \"{name}\" is neither an input of the model nor the target \"{target}\"",
                path.display()
            );
        }
    }
    if let Some(missing) = inputs.keys().find(|n| !batch.contains_key(**n)) {
        bail!("{}: no array for the model input \"{missing}\"", path.display());
    }
    let tgt = tgt.with_context(|| format!("{}: no array \"{target}\" (the --target)", path.display()))?;
    Ok((batch, tgt))
}

pub fn run(args: TrainCmdArgs) -> Result<()> {
    args.device.check()?;
    if args.per_kernel && !matches!(args.device.device, Device::Cuda | Device::Auto) {
        bail!("{}", crate::hint::per_kernel_needs_a_gpu());
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let graph = args.model.load()?;
    let n = args.train.accumulate.max(1);
    let micro = if n > 1 {
        read_microbatches(&args.inputs, &graph, args.train.target.as_deref(), n)?
    } else {
        vec![read_batch(&args.inputs, &graph, args.train.target.as_deref())?]
    };
    let Some((_, first_target)) = micro.first() else {
        bail!("{}: no batch", args.inputs.display());
    };
    let opts = args.train.options(first_target, args.budget.precision)?;
    let target_name = opts.loss.target.clone();
    let loss = opts.loss.clone();
    let progress = crate::common::Progress::new("compiling the training step");
    let step = graphc::train::compile_step(&graph, opts, &args.budget.options())?;
    drop(progress);
    let mut rerun = args.model.rerun(&args.budget);
    rerun.fit_options.extend(args.train.words());
    graphc::check_budget_on(&step, &rerun, args.device.device.planned_for())?;
    if let Some(t) = &step.train {
        println!(
            "train    {} parameters ({} elements) trained, {} frozen, {} buffers; {} state slots ({} updated in place); {} kernels",
            t.report.trainable.len(),
            t.report.trainable_elements,
            t.report.frozen.len(),
            t.report.buffers.len(),
            t.state.slots.len(),
            step.program.donated.len(),
            step.program.kernels.len()
        );
    }
    if n > 1 {
        println!("accumulate {n} microbatches a step: their gradients summed (each divided by {n}), then one update");
    }
    let mut batch = Vec::with_capacity(micro.len());
    for (mut b, target) in micro {
        if let Some(classes) = step.train.as_ref().and_then(|t| t.report.classes) {
            loss.check_labels(&target, classes)
                .map_err(|m| anyhow::anyhow!("{}: {m}", args.inputs.display()))?;
        }
        b.insert(target_name.clone(), target);
        batch.push(b);
    }
    let params = match args.device.device {
        Device::Cpu => {
            graphc::check_host_memory(&step)?;
            let mut s = graphc::train::cpu_session(&step)?;
            run_steps(&mut s, &batch, args.steps, HOST_NOTE)?;
            graphc::train::parameters(&step, &mut s)?
        }
        Device::CudaSim => {
            let mut s = graphc::train::sim_session(&step, &args.device.sim.options())?;
            run_steps(&mut s, &batch, args.steps, SIM_NOTE)?;
            graphc::train::parameters(&step, &mut s)?
        }
        Device::Cuda | Device::Auto => match graphc::train::cuda_session(&step, args.device.gpu.options()) {
            Ok(mut s) => {
                run_steps(&mut s, &batch, args.steps, DEVICE_NOTE)?;
                if args.per_kernel {
                    per_kernel(&step, &mut s, args.per_kernel_json.as_deref())?;
                }
                graphc::train::parameters(&step, &mut s)?
            }
            Err(graphc::Error::Cuda(e)) if e.is_unavailable() && args.device.device == Device::Auto => {
                println!("device   no usable GPU here, so the CPU: {e}");
                graphc::check_host_memory(&step)?;
                let mut s = graphc::train::cpu_session(&step)?;
                run_steps(&mut s, &batch, args.steps, HOST_NOTE)?;
                graphc::train::parameters(&step, &mut s)?
            }
            Err(e) => return Err(e.into()),
        },
    };
    if let Some(out) = args.output {
        graphc::npz::write_npz(&out, &params).with_context(|| format!("writing {}", out.display()))?;
        let stats = step.train.as_ref().map_or(0, |t| {
            t.state
                .slots
                .iter()
                .filter(|s| s.class == graphc::train::StateClass::Statistics)
                .count()
        });
        if stats > 0 {
            println!(
                "wrote    {} parameters and {stats} running statistics to {}",
                params.len() - stats,
                out.display()
            );
        } else {
            println!("wrote    {} parameters to {}", params.len(), out.display());
        }
    }
    Ok(())
}

/// `--per-kernel`: every launch of the step timed over 5 more steps on the batch on
/// the device (the state read before and written back after, so the steps run and
/// the parameters written are those of `--steps`), printed by kind and by launch.
fn per_kernel(
    step: &graphc::Compiled,
    s: &mut graphc::train::Stateful<graphc::train::CudaStep>,
    json: Option<&Path>,
) -> Result<()> {
    let names: Vec<&str> = step
        .train
        .as_ref()
        .map(|t| t.state.slots.iter().map(|x| x.name.as_str()).collect())
        .unwrap_or_default();
    let session = &mut s.runner_mut().0;
    let saved = session.read_inputs(&names)?;
    let timings = session.time_launches(5)?;
    let back: Vec<(&str, &Tensor)> = saved.iter().map(|(n, t)| (n.as_str(), t)).collect();
    session.write_inputs(&back)?;
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(&timings)?;
        graphc::ir::files::write_file(path, text.as_bytes()).context("writing the per-kernel JSON")?;
    }
    let total: f64 = timings.iter().map(|k| k.median_ms).sum();
    println!(
        "per launch  {} launches, sum of medians {total:.3} ms (one by one, without the CUDA graph)",
        timings.len()
    );
    // By kind of kernel: the name without its position (`k12_row_sum` -> `row_sum`).
    let mut kinds: Vec<(String, usize, f64)> = Vec::new();
    for k in &timings {
        let kind = match k.name.split_once('_') {
            Some((_, rest)) => rest.to_string(),
            None => k.kind.clone(),
        };
        match kinds.iter_mut().find(|(n, _, _)| *n == kind) {
            Some(e) => {
                e.1 += 1;
                e.2 += k.median_ms;
            }
            None => kinds.push((kind, 1, k.median_ms)),
        }
    }
    kinds.sort_by(|a, b| b.2.total_cmp(&a.2));
    println!("  by kind (the 15 slowest):");
    for (kind, n, ms) in kinds.iter().take(15) {
        println!(
            "    {kind:<32} {n:>5} launches {ms:>10.3} ms {:>5.1}%",
            100.0 * ms / total.max(1e-12)
        );
    }
    let mut slow: Vec<_> = timings.iter().collect();
    slow.sort_by(|a, b| b.median_ms.total_cmp(&a.median_ms));
    println!("  the 15 slowest launches:");
    for k in slow.iter().take(15) {
        println!("    {}", crate::bench::launch_line(k, total));
    }
    Ok(())
}

/// What one step's wall-clock time holds beyond the step, by device.
const HOST_NOTE: &str = "wall clock";
const SIM_NOTE: &str =
    "wall clock: the batch goes to the simulated device and the loss comes back each step; the state stays there";
const DEVICE_NOTE: &str =
    "wall clock: the batch goes to the GPU and the loss comes back each step; the state stays on the GPU";

fn run_steps<R: graphc::train::StepRunner>(
    s: &mut graphc::train::Stateful<R>,
    batch: &[HashMap<String, Tensor>],
    steps: u64,
    note: &str,
) -> Result<()> {
    let mut times = Vec::with_capacity(steps as usize);
    for n in 1..=steps {
        let t0 = std::time::Instant::now();
        // With gradient accumulation, one call per microbatch: the step's loss is
        // their mean (the full batch's, for a mean loss over equal microbatches).
        let mut outs = Vec::with_capacity(batch.len());
        for micro in batch {
            outs.push(graphc::train::step_once(s, micro)?);
        }
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let Some(&out) = outs.last() else {
            bail!("no batch");
        };
        let loss = outs.iter().map(|o| o.loss).sum::<f64>() / outs.len() as f64;
        match out.loss_scale {
            None => println!("step {n} loss {}", loss as f32),
            Some(scale) if out.skipped => println!(
                "step {n} loss {} scale {scale} skipped: an inf/NaN gradient (parameters and moments unchanged; the scale halves)",
                loss as f32
            ),
            Some(scale) => println!("step {n} loss {} scale {scale}", loss as f32),
        }
    }
    // The first step builds and loads what the device needs; the median of the others.
    let rest = times.get(1..).filter(|r| !r.is_empty()).unwrap_or(&times);
    let mut sorted = rest.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    println!(
        "time     median step {median:.3} ms over {} step(s) after the first ({note})",
        rest.len()
    );
    Ok(())
}
