//! The fuzz runner: seeded mutations of the fixtures (ONNX exports with their external
//! data, `.gir` text with its safetensors weights, `.npz` inputs) fed to the importers,
//! the parsers, the loaders and, where they load, the compiler and the CPU executor.
//!
//! Every input must give a value or an error: no panic, no run over 20 s, no abort
//! under an 8 GiB address-space cap (set for this process), no file read outside the
//! model's folder (the mutations point external data at `/etc/passwd` through paths
//! and links), no special file replaced.
//!
//! - `GRAPHC_FUZZ_SECONDS` (default 10) bounds the run; `GRAPHC_FUZZ_CASES` stops it
//!   after that many inputs; `GRAPHC_FUZZ_SEED` (default 1) picks the sequence.
//! - A failing input is written to `target/fuzz-failures/` with its target and seed;
//!   copy it into `tests/fuzz_corpus/<target>/` to keep it as a regression test: every
//!   file there runs first, on every `cargo test`.
//! - A case that runs past 60 s aborts the process naming the input (a hang).

mod mutate;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use graphc::ir::{Graph, Rng};

/// The longest one input may take.
const CASE_LIMIT: Duration = Duration::from_secs(20);
/// The address-space cap of this process.
const ADDRESS_SPACE: u64 = 8 << 30;
/// Plans bigger than this are compiled, not run.
const RUN_LIMIT_BYTES: u64 = 64 << 20;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// What one input is fed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// An ONNX model (its folder holds `model.onnx.data`).
    Onnx,
    /// A `.gir` text (its folder holds `model.safetensors` when it names one).
    Gir,
    /// The example block's safetensors weights.
    Safetensors,
    /// An `.npz` of inputs for the example block.
    Npz,
    /// `graphc` command lines with hostile values (the input: arguments, NUL-separated).
    Cli,
}

impl Target {
    const ALL: [Target; 5] = [Target::Onnx, Target::Gir, Target::Safetensors, Target::Npz, Target::Cli];

    fn name(self) -> &'static str {
        match self {
            Target::Onnx => "onnx",
            Target::Gir => "gir",
            Target::Safetensors => "safetensors",
            Target::Npz => "npz",
            Target::Cli => "cli",
        }
    }
}

/// An ONNX fixture: the model's bytes, its external data, the dims it is imported with.
type OnnxSeed = (Vec<u8>, Vec<u8>, BTreeMap<String, usize>);

/// The seeds: the real exports and the example block.
struct Seeds {
    onnx: Vec<OnnxSeed>,
    gir: String,
    safetensors: Vec<u8>,
    npz: Vec<u8>,
    block: Graph,
}

fn load_seeds() -> Seeds {
    let mut onnx = Vec::new();
    for name in ["gpt2", "bert", "llama", "vit", "gpt2_dynamic"] {
        let dir = repo(&format!("tests/fixtures/onnx/{name}"));
        let model = std::fs::read(dir.join("model.onnx")).expect("fixture");
        let data = std::fs::read(dir.join("model.onnx.data")).expect("fixture data");
        let dims: BTreeMap<String, usize> = if name == "gpt2_dynamic" {
            [("batch".to_string(), 2), ("seq".to_string(), 16)].into()
        } else {
            BTreeMap::new()
        };
        onnx.push((model, data, dims));
    }
    let block = repo("examples/models/transformer_block.gir");
    Seeds {
        onnx,
        gir: std::fs::read_to_string(&block).expect("block"),
        safetensors: std::fs::read(repo("examples/models/transformer_block.safetensors")).expect("weights"),
        npz: std::fs::read(repo("examples/models/transformer_block_inputs.npz")).expect("inputs"),
        block: graphc::load_model(&block, &[]).expect("the block loads"),
    }
}

/// A case's files, laid out in its own folder.
struct Case {
    target: Target,
    /// The mutated bytes (the file the target reads).
    input: Vec<u8>,
    dims: BTreeMap<String, usize>,
    /// Which ONNX fixture it came from (its external data is laid beside it).
    fixture: usize,
}

/// Make case `seed`'s input.
fn make_case(seeds: &Seeds, seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    // A command line costs a process: one case in sixteen.
    let target = if rng.below(16) == 0 {
        Target::Cli
    } else {
        Target::ALL[rng.below(4) as usize]
    };
    match target {
        Target::Cli => Case {
            target,
            input: cli_args(&mut rng).join("\0").into_bytes(),
            dims: BTreeMap::new(),
            fixture: 0,
        },
        Target::Onnx => {
            let fixture = rng.below(seeds.onnx.len() as u64) as usize;
            let (model, _, dims) = &seeds.onnx[fixture];
            Case {
                target,
                input: mutate::onnx_bytes(&mut rng, model),
                dims: dims.clone(),
                fixture,
            }
        }
        Target::Gir => {
            let mut text = seeds.gir.clone();
            for _ in 0..1 + rng.below(3) {
                text = mutate::gir(&mut rng, &text);
            }
            Case {
                target,
                input: text.into_bytes(),
                dims: BTreeMap::new(),
                fixture: 0,
            }
        }
        Target::Safetensors | Target::Npz => {
            let mut b = if target == Target::Npz {
                seeds.npz.clone()
            } else {
                seeds.safetensors.clone()
            };
            for _ in 0..1 + rng.below(4) {
                mutate::bytes(&mut rng, &mut b);
            }
            Case {
                target,
                input: b,
                dims: BTreeMap::new(),
                fixture: 0,
            }
        }
    }
}

/// A `graphc` command line with hostile values.
fn cli_args(rng: &mut Rng) -> Vec<String> {
    let pick = |rng: &mut Rng, xs: &[&str]| xs[rng.below(xs.len() as u64) as usize].to_string();
    let sizes = [
        "0",
        "1",
        "2",
        "16777216",
        "4294967296",
        "4611686018427387904",
        "18446744073709551615",
        "18446744073709551616",
        "-1",
        "abc",
        "",
    ];
    let command = pick(
        rng,
        &["ir", "opt", "plan", "fit", "run", "cuda", "launches", "random-inputs"],
    );
    let model = pick(
        rng,
        &[
            "examples/models/transformer_block.gir",
            "tests/fixtures/onnx/gpt2_dynamic/model.onnx",
            "tests/fixtures/onnx/llama/model.onnx",
        ],
    );
    let mut args = vec![command.clone(), model.clone()];
    if model.contains("dynamic") {
        if command == "fit" {
            args.push("--dim".into());
            args.push("batch".into());
            args.push("--dim".into());
            args.push(format!("seq={}", pick(rng, &["1", "16", "64"])));
        } else {
            args.push("--dim".into());
            args.push(format!("batch={}", pick(rng, &sizes)));
            args.push("--dim".into());
            args.push(format!("seq={}", pick(rng, &["1", "16", "64", "0"])));
        }
    }
    for _ in 0..rng.below(3) {
        let flag = pick(
            rng,
            &["--budget", "--max", "--precision", "--kernel", "--dim", "--seed"],
        );
        let value = match flag.as_str() {
            "--budget" => pick(
                rng,
                &[
                    "0",
                    "1",
                    "24GiB",
                    "1e30",
                    "-1GiB",
                    "nan",
                    "18446744073709551615",
                    "1.5TiB",
                ],
            ),
            "--precision" => pick(rng, &["fp32", "bf16", "fp16", "tf32", "int4"]),
            "--dim" => format!("{}={}", pick(rng, &["batch", "seq", "x", ""]), pick(rng, &sizes)),
            _ => pick(rng, &sizes),
        };
        args.push(flag);
        args.push(value);
    }
    // Outputs: sometimes the FIFO in the model's folder (it must survive).
    let out = pick(rng, &["m/out.npz", FIFO]);
    match command.as_str() {
        "run" => {
            args.extend(["--device".to_string(), "cpu".to_string()]);
            if rng.bool() {
                args.extend(["--output".to_string(), out]);
            }
        }
        "random-inputs" => args.extend(["-o".to_string(), out]),
        "plan" if rng.bool() => args.extend(["--svg".to_string(), out]),
        _ => {}
    }
    args
}

/// Run `graphc` with these arguments in `dir`; a panic, an abort, a signal or a run
/// past [`CASE_LIMIT`] panics here (so the case fails), exit 0, 1, 2 (usage) and 3
/// (no GPU) are answers.
fn run_cli(args: &[&str], dir: &Path) {
    use std::process::{Command, Stdio};
    let repo_root = repo("");
    let mut full: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if let Some(model) = full.get_mut(1) {
        *model = repo_root.join(model.as_str()).display().to_string();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_graphc"))
        .args(&full)
        .current_dir(dir)
        .env("GRAPHC_CACHE_DIR", dir.join("cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("graphc does not start: {e}"));
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                match status.code() {
                    Some(0..=3) if !err.contains("panicked") => return,
                    _ => panic!("graphc {} ended with {status}: {}", args.join(" "), err.trim()),
                }
            }
            Ok(None) if start.elapsed() > CASE_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("graphc {} ran past {} s", args.join(" "), CASE_LIMIT.as_secs());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for graphc: {e}"),
        }
    }
}

/// A file outside the model's folder that mutations point external data and weights
/// at (through `../`, absolute paths and links); reading it is a failure, seen in its
/// access time (set to 1970 before each case; relatime file systems update it on the
/// first read after that).
const OUTSIDE: &str = "outside/secret.bin";

/// A FIFO in the model's folder that command lines name as their output; it must still
/// be a FIFO afterwards.
const FIFO: &str = "m/out.fifo";

fn lay_out(dir: &Path) -> Result<PathBuf, String> {
    let _ = std::fs::remove_dir_all(dir);
    let io = |e: std::io::Error| e.to_string();
    let model_dir = dir.join("m");
    std::fs::create_dir_all(&model_dir).map_err(io)?;
    std::fs::create_dir_all(dir.join("outside")).map_err(io)?;
    let secret = dir.join(OUTSIDE);
    std::fs::write(&secret, vec![0x5au8; 1 << 16]).map_err(io)?;
    let old = std::fs::FileTimes::new().set_accessed(std::time::UNIX_EPOCH + Duration::from_secs(86_400));
    std::fs::File::options()
        .write(true)
        .open(&secret)
        .and_then(|f| f.set_times(old))
        .map_err(io)?;
    let _ = std::os::unix::fs::symlink(&secret, model_dir.join("data.link"));
    let _ = std::os::unix::fs::symlink(dir.join("outside"), model_dir.join("dir.link"));
    let c = std::ffi::CString::new(dir.join(FIFO).as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a valid NUL-terminated path.
    unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    Ok(model_dir)
}

/// Panic (a failure) if the case read the outside file or replaced the FIFO.
fn check_confinement(dir: &Path) {
    if let Ok(m) = std::fs::metadata(dir.join(OUTSIDE)) {
        let read = m
            .accessed()
            .is_ok_and(|t| t > std::time::UNIX_EPOCH + Duration::from_secs(2 * 86_400));
        assert!(!read, "a file outside the model's folder was read");
    }
    use std::os::unix::fs::FileTypeExt;
    let fifo = std::fs::symlink_metadata(dir.join(FIFO)).is_ok_and(|m| m.file_type().is_fifo());
    assert!(fifo, "the FIFO in the model's folder was replaced or removed");
}

/// Lay the case out in `dir` (the model in `dir/m`, and beside it what it reads; a file
/// outside it), run it, then check nothing outside was read and the FIFO is intact.
/// `Err` is a refusal (fine); a panic is a failure.
fn run_case(seeds: &Seeds, case: &Case, dir: &Path) -> Result<(), String> {
    let model_dir = lay_out(dir)?;
    let result = load_and_run(seeds, case, dir, &model_dir);
    check_confinement(dir);
    result
}

fn load_and_run(seeds: &Seeds, case: &Case, dir: &Path, model_dir: &Path) -> Result<(), String> {
    let write = |name: &str, bytes: &[u8]| std::fs::write(model_dir.join(name), bytes).map_err(|e| e.to_string());
    let graph = match case.target {
        Target::Cli => {
            let text = String::from_utf8_lossy(&case.input).into_owned();
            let args: Vec<&str> = text.split('\0').collect();
            run_cli(&args, dir);
            return Ok(());
        }
        Target::Onnx => {
            let data = seeds
                .onnx
                .get(case.fixture)
                .map_or(&[][..], |(_, data, _)| data.as_slice());
            write("model.onnx", &case.input)?;
            write("model.onnx.data", data)?;
            let opts = graphc::ir::onnx::ImportOptions {
                dims: case.dims.clone(),
            };
            graphc::ir::onnx::import_onnx(&model_dir.join("model.onnx"), &opts).map_err(|e| e.to_string())?
        }
        Target::Gir => {
            write("transformer_block.safetensors", &seeds.safetensors)?;
            write("model.gir", &case.input)?;
            graphc::load_model(&model_dir.join("model.gir"), &[]).map_err(|e| e.to_string())?
        }
        Target::Safetensors => {
            write("transformer_block.safetensors", &case.input)?;
            write("model.gir", seeds.gir.as_bytes())?;
            graphc::load_model(&model_dir.join("model.gir"), &[]).map_err(|e| e.to_string())?
        }
        Target::Npz => {
            write("inputs.npz", &case.input)?;
            let inputs =
                graphc::npz::read_inputs(&model_dir.join("inputs.npz"), &seeds.block).map_err(|e| e.to_string())?;
            let compiled = graphc::compile(&seeds.block).map_err(|e| e.to_string())?;
            graphc::run_cpu(&compiled, inputs).map_err(|e| e.to_string())?;
            return Ok(());
        }
    };
    compile_and_run(&graph)
}

/// What a loaded graph goes through: verify, compile (schedule, plan), the budget, and
/// when small enough a CPU run on random inputs.
fn compile_and_run(graph: &Graph) -> Result<(), String> {
    graph.verify().map_err(|e| format!("a loaded graph must verify: {e}"))?;
    let compiled = graphc::compile(graph).map_err(|e| e.to_string())?;
    graphc::check_budget(&compiled, &graphc::Rerun::default()).map_err(|e| e.to_string())?;
    if graphc::cpu_run_bytes(&compiled) + compiled.plan.weights_bytes > RUN_LIMIT_BYTES {
        return Ok(());
    }
    let inputs = graphc::try_random_input_list(graph, 1)
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect();
    graphc::run_cpu(&compiled, inputs).map_err(|e| e.to_string())?;
    Ok(())
}

/// Cap this process's address space, so an allocation the code did not check aborts
/// here as it would for a user with `ulimit -v`.
fn cap_address_space() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit read and write the struct they are given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut lim) == 0 && lim.rlim_cur > ADDRESS_SPACE {
            lim.rlim_cur = ADDRESS_SPACE;
            libc::setrlimit(libc::RLIMIT_AS, &lim);
        }
    }
}

/// A case that failed: its target, what went wrong, and where its input was saved.
#[derive(Debug)]
struct Failure {
    target: &'static str,
    what: String,
    saved: PathBuf,
}

fn failures_dir() -> PathBuf {
    repo("target/fuzz-failures")
}

/// Run one case under `catch_unwind` and the time limit; `Some` when it failed.
fn check_case(seeds: &Seeds, case: &Case, dir: &Path, label: &str) -> Option<Failure> {
    let start = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| run_case(seeds, case, dir)));
    let took = start.elapsed();
    let what = match result {
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            format!("panicked: {msg}")
        }
        Ok(_) if took > CASE_LIMIT => format!("took {:.1} s", took.as_secs_f64()),
        Ok(_) => return None,
    };
    let fixture = ["gpt2", "bert", "llama", "vit", "gpt2_dynamic"][case.fixture.min(4)];
    let name = match case.target {
        Target::Onnx => format!("{fixture}-{label}"),
        _ => label.to_string(),
    };
    let saved = failures_dir().join(case.target.name()).join(name);
    let _ = std::fs::create_dir_all(saved.parent().unwrap_or(Path::new(".")));
    let _ = std::fs::write(&saved, &case.input);
    Some(Failure {
        target: case.target.name(),
        what,
        saved,
    })
}

fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A watchdog: a case past 60 s is a hang; abort naming it (the runner cannot be unwound
/// out of a blocked call).
fn watchdog(current: Arc<Mutex<Option<(String, Instant)>>>) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = current.lock().map(|c| c.clone()).unwrap_or(None);
        if let Some((label, start)) = now {
            if start.elapsed() > Duration::from_secs(60) {
                eprintln!("fuzz: case {label} ran past 60 s (a hang); aborting");
                std::process::abort();
            }
        }
    });
}

/// Every input kept in `tests/fuzz_corpus/<target>/` runs clean.
#[test]
fn fuzz_corpus_regressions() {
    let seeds = load_seeds();
    let mut failures = Vec::new();
    let mut n = 0;
    for target in Target::ALL {
        let dir = repo(&format!("tests/fuzz_corpus/{}", target.name()));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            let input = std::fs::read(&path).expect("corpus file");
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            // `gpt2_dynamic` inputs say so in their name; they need its dims.
            let dims = if name.contains("dynamic") {
                [("batch".to_string(), 2), ("seq".to_string(), 16)].into()
            } else {
                BTreeMap::new()
            };
            let fixture = ["gpt2", "bert", "llama", "vit", "dynamic"]
                .iter()
                .position(|f| name.contains(f))
                .unwrap_or(0);
            let case = Case {
                target,
                input,
                dims,
                fixture,
            };
            let work = std::env::temp_dir().join(format!("graphc-fuzz-corpus-{}", std::process::id()));
            if let Some(f) = check_case(&seeds, &case, &work, &name) {
                failures.push(format!("{}: {}", path.display(), f.what));
            }
            n += 1;
        }
    }
    println!("fuzz corpus: {n} inputs");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Mutation fuzzing for `GRAPHC_FUZZ_SECONDS` (default 10) on two threads.
#[test]
fn fuzz_importers() {
    cap_address_space();
    let seconds = env_u64("GRAPHC_FUZZ_SECONDS", 10);
    let max_cases = env_u64("GRAPHC_FUZZ_CASES", u64::MAX);
    let base = env_u64("GRAPHC_FUZZ_SEED", 1);
    let seeds = Arc::new(load_seeds());
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let next = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<Failure>::new()));
    let counts = Arc::new(Mutex::new(BTreeMap::<&'static str, (u64, u64)>::new()));
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (seeds, next, failures, counts) = (seeds.clone(), next.clone(), failures.clone(), counts.clone());
            let current = Arc::new(Mutex::new(None));
            watchdog(current.clone());
            std::thread::spawn(move || {
                let dir = std::env::temp_dir().join(format!("graphc-fuzz-{}-{w}", std::process::id()));
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= max_cases {
                        break;
                    }
                    let seed = base.wrapping_mul(1_000_003).wrapping_add(i);
                    let Ok(case) = std::panic::catch_unwind(AssertUnwindSafe(|| make_case(&seeds, seed))) else {
                        if let Ok(mut fs) = failures.lock() {
                            fs.push(Failure {
                                target: "mutator",
                                what: format!("making case {i} (seed {seed}) panicked"),
                                saved: PathBuf::new(),
                            });
                        }
                        continue;
                    };
                    let label = format!("seed-{base}-case-{i}");
                    if let Ok(mut c) = current.lock() {
                        *c = Some((label.clone(), Instant::now()));
                    }
                    let start = Instant::now();
                    let ok_before = std::panic::catch_unwind(AssertUnwindSafe(|| run_case(&seeds, &case, &dir)));
                    let loaded = matches!(ok_before, Ok(Ok(())));
                    let failed = match ok_before {
                        Err(_) => check_case(&seeds, &case, &dir, &label),
                        Ok(_) if start.elapsed() > CASE_LIMIT => check_case(&seeds, &case, &dir, &label),
                        Ok(_) => None,
                    };
                    if let Ok(mut c) = counts.lock() {
                        let e = c.entry(case.target.name()).or_default();
                        e.0 += 1;
                        e.1 += loaded as u64;
                    }
                    if let Some(f) = failed {
                        if let Ok(mut fs) = failures.lock() {
                            fs.push(f);
                        }
                    }
                }
                if let Ok(mut c) = current.lock() {
                    *c = None;
                }
                let _ = std::fs::remove_dir_all(&dir);
            })
        })
        .collect();
    let mut dead_workers = 0;
    for w in workers {
        dead_workers += w.join().is_err() as usize;
    }
    std::panic::set_hook(quiet);
    let counts = counts.lock().map(|c| c.clone()).unwrap_or_default();
    let total: u64 = counts.values().map(|c| c.0).sum();
    let per: Vec<String> = counts
        .iter()
        .map(|(t, (n, ok))| format!("{t} {n} ({ok} loaded and ran)"))
        .collect();
    println!("fuzz: {total} inputs in {seconds} s max: {}", per.join(", "));
    let failures = failures.lock().map(|f| {
        f.iter()
            .map(|f| format!("{}: {} (input saved as {})", f.target, f.what, f.saved.display()))
            .collect::<Vec<_>>()
    });
    let failures = failures.unwrap_or_default();
    let mut failures = failures;
    if dead_workers > 0 {
        failures.push(format!("{dead_workers} worker thread(s) panicked outside a case"));
    }
    println!("fuzz: {} failures", failures.len());
    assert!(
        failures.is_empty(),
        "{}\n(copy each saved input into tests/fuzz_corpus/<target>/ once fixed)",
        failures.join("\n")
    );
}

/// The confinement check sees a read of the outside file and a replaced FIFO (on file
/// systems that keep access times; elsewhere only the FIFO half can be checked).
#[test]
fn confinement_check_sees_reads_and_replacements() {
    let dir = std::env::temp_dir().join(format!("graphc-fuzz-check-{}", std::process::id()));
    lay_out(&dir).expect("layout");
    check_confinement(&dir);
    let _ = std::fs::read(dir.join(OUTSIDE));
    let atime_kept = std::fs::metadata(dir.join(OUTSIDE))
        .and_then(|m| m.accessed())
        .is_ok_and(|t| t > std::time::UNIX_EPOCH + Duration::from_secs(2 * 86_400));
    if atime_kept {
        assert!(std::panic::catch_unwind(|| check_confinement(&dir)).is_err());
    } else {
        println!("this file system does not update access times: reads outside are not seen");
    }
    lay_out(&dir).expect("layout");
    std::fs::remove_file(dir.join(FIFO)).expect("remove");
    std::fs::write(dir.join(FIFO), b"replaced").expect("write");
    assert!(std::panic::catch_unwind(|| check_confinement(&dir)).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
