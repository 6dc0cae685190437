//! `graphc ir`: the imported graph as text IR or JSON, or an ONNX model's unsupported
//! nodes.

use std::path::Path;

use anyhow::{bail, Result};

use crate::args::ModelArgs;

#[derive(clap::Args)]
pub struct IrArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the graph as JSON instead.
    #[arg(long)]
    pub json: bool,
    /// List every node whose op graphc does not support (ONNX models), then stop.
    #[arg(long)]
    pub list_unsupported: bool,
}

pub fn run(args: IrArgs) -> Result<()> {
    if args.list_unsupported {
        let nodes = unsupported(&args.model.model)?;
        for n in &nodes {
            let domain = if n.domain.is_empty() { "ai.onnx" } else { &n.domain };
            println!("node {}: {} (domain {domain}, opset {})", n.node, n.op_type, n.opset);
        }
        println!("{} unsupported node(s)", nodes.len());
        return Ok(());
    }
    let graph = args.model.load()?;
    if args.json {
        println!("{}", graph.to_json());
    } else {
        print!("{}", graphc::ir::print(&graph));
    }
    Ok(())
}

fn unsupported(model: &Path) -> Result<Vec<graphc::ir::onnx::UnsupportedNode>> {
    if model.extension().is_none_or(|e| e != "onnx") {
        bail!("--list-unsupported applies to .onnx models");
    }
    Ok(graphc::list_unsupported(model)?)
}
