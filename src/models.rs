//! Reference models built with the builder: the examples, the tests and the benchmarks
//! all use these, so each is written once.

use graphc_ir::nn::{self, GeluApprox};
use graphc_ir::{DType, Graph, GraphBuilder, GraphError, Tensor, TensorType, Value};

/// A GELU MLP: `x -> linear -> gelu -> ... -> linear`.
#[derive(Clone, Debug)]
pub struct MlpConfig {
    pub batch: usize,
    /// Layer widths, input first: `[784, 512, 10]` is two linear layers.
    pub widths: Vec<usize>,
    pub dtype: DType,
    pub seed: u64,
}

impl Default for MlpConfig {
    fn default() -> Self {
        MlpConfig {
            batch: 8,
            widths: vec![64, 256, 64],
            dtype: DType::F32,
            seed: 0,
        }
    }
}

/// A GPT-style decoder stack of pre-LN blocks (no embedding or head).
#[derive(Clone, Debug)]
pub struct GptConfig {
    pub batch: usize,
    pub seq: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    pub dtype: DType,
    pub seed: u64,
}

impl Default for GptConfig {
    /// The block saved as `examples/models/transformer_block.gir`.
    fn default() -> Self {
        GptConfig {
            batch: 2,
            seq: 16,
            d_model: 128,
            heads: 4,
            layers: 1,
            dtype: DType::F32,
            seed: 0,
        }
    }
}

/// Deterministic weights: each parameter gets its own seed from the model seed.
struct Init<'b> {
    b: &'b GraphBuilder,
    dtype: DType,
    seed: u64,
}

impl<'b> Init<'b> {
    fn next_seed(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.seed
    }

    /// Normal(0, std).
    fn normal(&mut self, name: &str, shape: &[usize], std: f64) -> Value<'b> {
        let seed = self.next_seed();
        self.b
            .param(name, Tensor::randn(&TensorType::new(self.dtype, shape), std, seed))
    }

    /// 1 + Normal(0, 0.1): a norm's gain, not exactly one so that tests see it.
    fn gain(&mut self, name: &str, n: usize) -> Result<Value<'b>, GraphError> {
        let seed = self.next_seed();
        let noise = Tensor::randn(&TensorType::new(DType::F64, [n]), 0.1, seed).to_f64_vec();
        let v: Vec<f64> = noise.iter().map(|x| 1.0 + x).collect();
        let t = Tensor::from_f64(self.dtype, [n], &v).map_err(|e| GraphError::Graph(format!("{name}: {e}")))?;
        Ok(self.b.param(name, t))
    }

    fn linear(&mut self, name: &str, x: Value<'b>, d_in: usize, d_out: usize) -> Value<'b> {
        let w = self.normal(&format!("{name}.weight"), &[d_out, d_in], 1.0 / (d_in as f64).sqrt());
        let bias = self.normal(&format!("{name}.bias"), &[d_out], 0.02);
        self.b.scope(name, || nn::linear(x, w, Some(bias)))
    }
}

/// The MLP as a graph with input `x: [batch, widths[0]]` and output `y`.
pub fn mlp(cfg: &MlpConfig) -> Result<Graph, GraphError> {
    let b = GraphBuilder::new();
    let mut init = Init {
        b: &b,
        dtype: cfg.dtype,
        seed: cfg.seed,
    };
    let Some(&width_in) = cfg.widths.first() else {
        return Err(GraphError::Graph("an MLP needs at least one width".to_string()));
    };
    let mut h = b.input("x", cfg.dtype, [cfg.batch, width_in]);
    let layers = cfg.widths.len().saturating_sub(1);
    for (i, (&d_in, &d_out)) in cfg.widths.iter().zip(cfg.widths.iter().skip(1)).enumerate() {
        h = init.linear(&format!("fc{i}"), h, d_in, d_out);
        if i + 1 < layers {
            h = b.scope(&format!("act{i}"), || nn::gelu(h, GeluApprox::Erf));
        }
    }
    b.output("y", h);
    b.finish()
}

/// The GPT stack as a graph with input `x: [batch, seq, d_model]` and output `y`.
///
/// Each block: `x + proj(attn(ln1(x)))`, then `h + fc2(gelu(fc1(ln2(h))))`, with causal
/// softmax attention over `heads` heads and an MLP of width `4 d_model`.
pub fn gpt(cfg: &GptConfig) -> Result<Graph, GraphError> {
    let b = GraphBuilder::new();
    let mut init = Init {
        b: &b,
        dtype: cfg.dtype,
        seed: cfg.seed,
    };
    let d = cfg.d_model;
    let mut x = b.input("x", cfg.dtype, [cfg.batch, cfg.seq, d]);
    for layer in 0..cfg.layers {
        let p = format!("h{layer}");
        let g1 = init.gain(&format!("{p}.ln1.weight"), d)?;
        let b1 = init.normal(&format!("{p}.ln1.bias"), &[d], 0.02);
        let h = b.scope(&format!("{p}.ln1"), || nn::layer_norm(x, Some(g1), Some(b1), 1e-5));
        let qkv = init.linear(&format!("{p}.attn.qkv"), h, d, 3 * d);
        let a = b.scope(&format!("{p}.attn"), || nn::causal_attention(qkv, cfg.heads));
        let a = init.linear(&format!("{p}.attn.proj"), a, d, d);
        x = b.scope(&format!("{p}.res1"), || x + a);
        let g2 = init.gain(&format!("{p}.ln2.weight"), d)?;
        let b2 = init.normal(&format!("{p}.ln2.bias"), &[d], 0.02);
        let h = b.scope(&format!("{p}.ln2"), || nn::layer_norm(x, Some(g2), Some(b2), 1e-5));
        let h = init.linear(&format!("{p}.mlp.fc1"), h, d, 4 * d);
        let h = b.scope(&format!("{p}.mlp.gelu"), || nn::gelu(h, GeluApprox::Erf));
        let h = init.linear(&format!("{p}.mlp.fc2"), h, 4 * d, d);
        x = b.scope(&format!("{p}.res2"), || x + h);
    }
    b.output("y", x);
    b.finish()
}

/// One pre-LN transformer block (a [`gpt`] of one layer).
pub fn transformer_block(cfg: &GptConfig) -> Result<Graph, GraphError> {
    gpt(&GptConfig {
        layers: 1,
        ..cfg.clone()
    })
}

/// The kernel benchmarks of the GPU comparison (issue 5): graphs of one fused kernel
/// each, run by graphc, PyTorch eager and torch.compile on the same inputs.
pub mod kernel_bench {
    use super::*;

    /// (a) `y = gelu(x * a + b) * sigmoid(x)` on `n` f32 elements (`a`, `b` scalars,
    /// erf GELU).
    pub fn gelu_sigmoid(n: usize) -> Result<Graph, GraphError> {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [n]);
        let y = nn::gelu(x * 1.5 + 0.25, GeluApprox::Erf) * x.unary(graphc_ir::UnaryOp::Sigmoid);
        b.output("y", y);
        b.finish()
    }

    /// (b) `gelu(layer_norm(x))` over the last axis of `[rows, cols]` in `dtype`
    /// (affine weights; the norm computed in the input's dtype as PyTorch's is).
    pub fn layernorm_gelu(rows: usize, cols: usize, dtype: DType) -> Result<Graph, GraphError> {
        let b = GraphBuilder::new();
        let x = b.input("x", dtype, [rows, cols]);
        let g = b.param("ln.weight", Tensor::randn(&TensorType::new(dtype, [cols]), 1.0, 1));
        let beta = b.param("ln.bias", Tensor::randn(&TensorType::new(dtype, [cols]), 1.0, 2));
        let y = nn::gelu(nn::layer_norm(x, Some(g), Some(beta), 1e-5), GeluApprox::Erf);
        b.output("y", y);
        b.finish()
    }

    /// (c) softmax over the last axis of `[rows, cols]` f32.
    pub fn softmax(rows: usize, cols: usize) -> Result<Graph, GraphError> {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [rows, cols]);
        b.output("y", nn::softmax(x, -1));
        b.finish()
    }

    /// The three at the sizes of the GPU comparison: 64M f32; [8192, 4096] bf16;
    /// [8192, 8192] f32.
    pub fn all() -> Result<Vec<(&'static str, Graph)>, GraphError> {
        Ok(vec![
            ("gelu_sigmoid_64M_f32", gelu_sigmoid(64 << 20)?),
            (
                "layernorm_gelu_8192x4096_bf16",
                layernorm_gelu(8192, 4096, DType::BF16)?,
            ),
            ("softmax_8192x8192_f32", softmax(8192, 8192)?),
        ])
    }
}
