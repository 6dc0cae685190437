//! The offset planner on MiniMalloc's benchmark instances A–K (`id,lower,upper,size`
//! CSVs; capacity 1 MiB), vendored in `compiler/tests/data/minimalloc` (see its README.md
//! for the source and license).
//!
//! `cargo bench -p graphc-compiler --bench minimalloc` prints a markdown table: per
//! instance the lower bound, the best greedy arena, the final arena (all / 1 MiB), whether
//! it fits in 1 MiB, and the time. The data folder is `$GRAPHC_MINIMALLOC_DIR`, else the
//! vendored `compiler/tests/data/minimalloc`; a missing folder, a folder without CSVs or
//! an instance that cannot be read or planned is an error (the bench exits with status 1).
//! `$GRAPHC_MINIMALLOC_SECONDS` sets the per-instance time budget (default 5).

use std::path::PathBuf;
use std::time::Duration;

use graphc_compiler::plan::{assign_offsets, verify, Interval, PlanOptions};

const MIB: u64 = 1 << 20;

fn load(path: &std::path::Path) -> Result<Vec<Interval>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |k: usize| -> Result<u64, String> {
            f.get(k)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{}:{}: bad field {k}", path.display(), n + 1))
        };
        let t = |v: u64| u32::try_from(v).map_err(|_| format!("{}:{}: time {v} too large", path.display(), n + 1));
        out.push(Interval {
            start: t(num(1)?)?,
            end: t(num(2)?)?,
            size: num(3)?,
        });
    }
    Ok(out)
}

/// Reports a fatal problem with the data and exits with status 1.
fn fail(why: &str) -> ! {
    eprintln!("minimalloc: {why}");
    std::process::exit(1)
}

fn main() {
    let dir = std::env::var_os("GRAPHC_MINIMALLOC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/minimalloc")));
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect(),
        Err(e) => fail(&format!("{}: {e}", dir.display())),
    };
    files.sort();
    if files.is_empty() {
        fail(&format!("no CSV in {}", dir.display()));
    }
    let secs: f64 = std::env::var("GRAPHC_MINIMALLOC_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let opts = PlanOptions {
        align: 1,
        time_budget: Duration::from_secs_f64(secs),
        capacity: Some(MIB),
        node_limit: u64::MAX,
    };
    println!("MiniMalloc instances, capacity 1 MiB; align = 1 (sizes are not 256-aligned; the");
    println!("published results use no alignment); search budget {secs} s per instance, target 1 MiB.\n");
    println!("| instance | buffers | lower bound / 1 MiB | best greedy / 1 MiB (order) | final / 1 MiB | fits 1 MiB | search states | time |");
    println!("|---|---|---|---|---|---|---|---|");
    let (mut lg, mut gg, mut fg, mut count, mut fits) = (0.0f64, 0.0f64, 0.0f64, 0usize, 0usize);
    let mut failed = 0usize;
    for path in &files {
        let name = path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let bufs = match load(path) {
            Ok(b) => b,
            Err(e) => {
                println!("| {name} | error: {e} | | | | | | |");
                failed += 1;
                continue;
            }
        };
        let p = match assign_offsets(&bufs, &opts) {
            Ok(p) => p,
            Err(e) => {
                println!("| {name} | {} | error: {e} | | | | | |", bufs.len());
                failed += 1;
                continue;
            }
        };
        if let Err(e) = verify(&bufs, &p, opts.align) {
            println!("| {name} | {} | VERIFY FAILED: {e} | | | | | |", bufs.len());
            failed += 1;
            continue;
        }
        let r = |b: u64| b as f64 / MIB as f64;
        let fit = p.arena <= MIB;
        println!(
            "| {name} | {} | {:.3} | {:.3} ({}) | {:.3} ({}) | {} | {} | {:.2} s |",
            bufs.len(),
            r(p.lower_bound),
            r(p.greedy_arena),
            p.greedy_strategy.name().trim_start_matches("greedy:"),
            r(p.arena),
            p.strategy,
            if fit { "yes" } else { "no" },
            p.search_nodes,
            p.time.as_secs_f64()
        );
        lg += r(p.lower_bound).ln();
        gg += r(p.greedy_arena).ln();
        fg += r(p.arena).ln();
        count += 1;
        fits += usize::from(fit);
    }
    if count > 0 {
        let c = count as f64;
        println!(
            "| geometric mean | | {:.3} | {:.3} | {:.3} | {fits}/{count} | | |",
            (lg / c).exp(),
            (gg / c).exp(),
            (fg / c).exp()
        );
    }
    if failed > 0 {
        fail(&format!("{failed} of {} instances failed", files.len()));
    }
}
