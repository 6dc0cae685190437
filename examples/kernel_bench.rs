//! The kernels of the GPU comparison (src/models.rs, `kernel_bench`): writes each as a
//! `.gir` (weights beside it) for `graphc cuda` / `graphc ptx` and the GPU benchmark, and
//! prints each one's kernel and global-memory traffic.
//!
//! `cargo run --release --example kernel_bench -- OUT_DIR`

use graphc::ir::weights::save_gir;
use graphc::models::kernel_bench;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "target/kernel_bench".into()));
    std::fs::create_dir_all(&dir)?;
    for (name, g) in kernel_bench::all()? {
        let path = dir.join(format!("{name}.gir"));
        save_gir(&g, &path)?;
        let c = graphc::compile(&g)?;
        let k = &c.program.kernels[0];
        println!(
            "{name}: {} kernel {} ({} bytes of global memory traffic) -> {}",
            c.program.kernels.len(),
            k.name,
            c.program.traffic(),
            path.display()
        );
    }
    Ok(())
}
