//! What a kernel executes, counted by running its own CUDA C on cuda-sim over a sample
//! of its blocks (the runtime's counting build fills this; the model only reads it).

use serde::Serialize;

/// The counts of one launch over its sampled blocks (totals over those blocks), and the
/// launch's shape. [`KernelCounters::scale`] takes them to the whole grid: the grid is
/// homogeneous (every block runs the same code on its own part of the data), so the
/// sampled blocks stand for all of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct KernelCounters {
    pub grid: u64,
    pub block_threads: u32,
    /// Dynamic shared memory of the launch, bytes.
    pub dynamic_shared: u32,
    pub sampled_blocks: u64,
    pub warps: u64,
    pub threads: u64,
    /// Warp-level global load requests (an atomic counts as a load too) and the 32-byte
    /// sectors they touch: a coalesced f32 load is 4 sectors a request, a stride-32
    /// one 32.
    pub load_requests: u64,
    pub load_sectors: u64,
    /// Bytes the lanes asked for (what a perfectly coalesced access would move).
    pub load_bytes: u64,
    pub store_requests: u64,
    pub store_sectors: u64,
    pub store_bytes: u64,
    pub atomic_requests: u64,
    pub shared_load_requests: u64,
    pub shared_store_requests: u64,
    /// Shared-memory wavefronts (bank conflicts included) and the wavefronts the same
    /// requests would take without conflicts.
    pub shared_wavefronts: u64,
    pub shared_ideal_wavefronts: u64,
    /// Warp-level `mma.sync.m16n8k16` (4,096 FLOPs each).
    pub mmas: u64,
    /// `__syncthreads` per block, summed over the sampled blocks.
    pub barriers: u64,
    /// Basic blocks each warp issues (its busiest lane's count: a warp issues the union
    /// of its lanes' paths), summed; and over all threads.
    pub warp_basic_blocks: u64,
    pub thread_basic_blocks: u64,
    /// Distinct global sectors each sampled block touches, summed (its unique traffic).
    pub block_distinct_sectors: u64,
    /// Instructions each warp issues (its busiest lane's: the kernel's own instructions
    /// in each basic block it runs, from the counting build's disassembly), summed; 0
    /// where the blocks had no weights (the model then counts basic blocks).
    pub warp_instructions: u64,
}

/// The runner's counters, in `sim_count.cpp`'s order.
const RAW_FIELDS: usize = 21;

impl KernelCounters {
    /// From the runner's answer (`blocks, warps, threads, load requests, sectors,
    /// bytes, store requests, sectors, bytes, atomics, shared loads, shared stores,
    /// wavefronts, ideal wavefronts, mmas, barriers, warp blocks, thread blocks,
    /// distinct sectors, local accesses, warp instructions`).
    pub fn from_raw(raw: &[u64], grid: u64, block_threads: u32, dynamic_shared: u32) -> Result<Self, String> {
        if raw.len() < RAW_FIELDS {
            return Err(format!("{} counters, expected {RAW_FIELDS}", raw.len()));
        }
        Ok(KernelCounters {
            grid,
            block_threads,
            dynamic_shared,
            sampled_blocks: raw[0],
            warps: raw[1],
            threads: raw[2],
            load_requests: raw[3],
            load_sectors: raw[4],
            load_bytes: raw[5],
            store_requests: raw[6],
            store_sectors: raw[7],
            store_bytes: raw[8],
            atomic_requests: raw[9],
            shared_load_requests: raw[10],
            shared_store_requests: raw[11],
            shared_wavefronts: raw[12],
            shared_ideal_wavefronts: raw[13],
            mmas: raw[14],
            barriers: raw[15],
            warp_basic_blocks: raw[16],
            thread_basic_blocks: raw[17],
            block_distinct_sectors: raw[18],
            warp_instructions: raw[20],
        })
    }

    /// Whole grid / sampled blocks.
    pub fn scale(&self) -> f64 {
        self.grid as f64 / self.sampled_blocks.max(1) as f64
    }

    /// Sectors per global request (loads and stores): 4 for coalesced f32, 32 at worst.
    pub fn sectors_per_request(&self) -> f64 {
        (self.load_sectors + self.store_sectors) as f64 / (self.load_requests + self.store_requests).max(1) as f64
    }

    /// Shared wavefronts per conflict-free wavefront: 1 without bank conflicts, 32 at worst.
    pub fn bank_conflict_factor(&self) -> f64 {
        self.shared_wavefronts as f64 / self.shared_ideal_wavefronts.max(1) as f64
    }

    /// The blocks to sample of a grid: the first, the middle and the last (the grid's
    /// edge, where bounds checks cut the work), each once.
    pub fn sample(grid: u32) -> Vec<u32> {
        let mut s = vec![0, grid / 2, grid.saturating_sub(1)];
        s.retain(|&b| b < grid);
        s.dedup();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_first_middle_last() {
        assert_eq!(KernelCounters::sample(1), vec![0]);
        assert_eq!(KernelCounters::sample(2), vec![0, 1]);
        assert_eq!(KernelCounters::sample(100), vec![0, 50, 99]);
        assert!(KernelCounters::sample(0).is_empty());
        let c = KernelCounters::from_raw(&[3; 21], 300, 256, 0).unwrap();
        assert_eq!(c.scale(), 100.0);
        assert!(KernelCounters::from_raw(&[0; 5], 1, 1, 0).is_err());
    }
}
