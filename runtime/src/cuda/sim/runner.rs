//! The runner process: spawned once per session, spoken to over its stdin and stdout
//! (the protocol at the top of `sim_rt.cpp`), its stderr kept for the sanitizers'
//! reports. A launch that does not answer within the timeout is a hang: the runner is
//! killed and the launch named.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::Sanitize;

/// At most this much of the runner's stderr is kept.
const STDERR_LIMIT: usize = 1 << 20;

/// One argument of a launch as the runner sees it.
pub struct RunnerArg<'a> {
    pub bytes: u64,
    pub read: bool,
    pub write: bool,
    /// An earlier argument with the same address (an in-place pair).
    pub alias: Option<u32>,
    /// The bytes to send (arguments that lead a group some member of which reads).
    pub data: Option<&'a [u8]>,
}

/// The shape and limits of one launch.
pub struct Shape {
    pub grid: u32,
    pub block: u32,
    pub dyn_smem: u32,
    /// Static + dynamic shared memory a block may use (the opt-in maximum).
    pub smem_limit: u32,
    /// Static shared memory a block may declare (48 KiB on every GPU since Volta).
    pub static_limit: u32,
    /// Threads of one wave of blocks run at once.
    pub wave_threads: u32,
}

/// Why a request failed.
pub enum Failure {
    /// The runner answered with an error (the launch is over; the runner lives on).
    Reported(String),
    /// The runner died, hung or broke the protocol; it is gone.
    Died(String),
}

pub struct Runner {
    /// What it was started as (to start it again after a failure).
    program: PathBuf,
    mode: Sanitize,
    /// Objects loaded so far, and their module numbers.
    loaded: std::collections::HashMap<std::path::PathBuf, u32>,
    child: Child,
    stdin: Option<ChildStdin>,
    chunks: Receiver<Vec<u8>>,
    pending: Vec<u8>,
    stderr: Arc<Mutex<Vec<u8>>>,
    timeout: Duration,
    dead: bool,
}

impl Runner {
    pub fn spawn(program: &Path, mode: Sanitize, timeout: Duration) -> Result<Runner, String> {
        let mut cmd = Command::new(program);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.env(
            "ASAN_OPTIONS",
            "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:print_summary=1:allocator_may_return_null=1",
        )
        .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1:exitcode=87")
        .env(
            "TSAN_OPTIONS",
            "halt_on_error=1:exitcode=66:report_signal_unsafe=0:second_deadlock_stack=0:history_size=4",
        );
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the runner {}: {e}", program.display()))?;
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take().ok_or("the runner has no stdout")?;
        let mut stderr = child.stderr.take().ok_or("the runner has no stderr")?;
        let (tx, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let err_buf = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&err_buf);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 14];
            loop {
                match stderr.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                        let room = STDERR_LIMIT.saturating_sub(s.len());
                        s.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
        });
        Ok(Runner {
            program: program.to_path_buf(),
            mode,
            loaded: Default::default(),
            child,
            stdin,
            chunks,
            pending: Vec::new(),
            stderr: err_buf,
            timeout,
            dead: false,
        })
    }

    /// Load a kernel object (once); its module number.
    pub fn load(&mut self, path: &Path) -> Result<u32, Failure> {
        if let Some(&m) = self.loaded.get(path) {
            return Ok(m);
        }
        let m = self.load_new(path)?;
        self.loaded.insert(path.to_path_buf(), m);
        Ok(m)
    }

    fn load_new(&mut self, path: &Path) -> Result<u32, Failure> {
        let p = path.as_os_str().as_encoded_bytes();
        let mut msg = Vec::with_capacity(8 + p.len());
        put_u32(&mut msg, 1);
        put_u32(&mut msg, p.len() as u32);
        msg.extend_from_slice(p);
        self.send(&[&msg])?;
        let deadline = Instant::now() + self.timeout;
        self.status(deadline)?;
        self.read_u32(deadline)
    }

    /// A LAUNCH's or COUNT's header and argument table.
    fn head(command: u32, module: u32, shape: &Shape, args: &[RunnerArg]) -> Vec<u8> {
        let mut head = Vec::with_capacity(36 + 16 * args.len());
        let s = shape;
        for v in [
            command,
            module,
            s.grid,
            s.block,
            s.dyn_smem,
            s.smem_limit,
            s.static_limit,
            s.wave_threads,
            args.len() as u32,
        ] {
            put_u32(&mut head, v);
        }
        for a in args {
            head.extend_from_slice(&a.bytes.to_le_bytes());
            put_u32(&mut head, a.read as u32 | (a.write as u32) << 1);
            put_u32(&mut head, a.alias.unwrap_or(u32::MAX));
        }
        head
    }

    /// Run one launch; the bytes of each argument group that writes, in argument order.
    pub fn launch(&mut self, module: u32, shape: &Shape, args: &[RunnerArg]) -> Result<Vec<Vec<u8>>, Failure> {
        let head = Self::head(2, module, shape, args);
        let mut parts: Vec<&[u8]> = vec![&head];
        parts.extend(args.iter().filter_map(|a| a.data));
        self.send(&parts)?;
        let deadline = Instant::now() + self.timeout;
        self.status(deadline)?;
        let mut out = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let writes = a.alias.is_none()
                && args
                    .iter()
                    .enumerate()
                    .any(|(j, b)| (j == i || b.alias == Some(i as u32)) && b.write);
            if writes {
                out.push(self.read_bytes(a.bytes as usize, deadline)?);
            }
        }
        Ok(out)
    }

    /// Count one launch in a counting runner: only the blocks of `sample` run, on
    /// zeroed arguments (no bytes sent) but those `fills` names (an argument's `(hi,
    /// width)`: integers of `width` bytes spread over `[0, hi)`; `(0, 0)` zeros); the
    /// runner's counters (`sim_count.cpp`'s order).
    pub fn count(
        &mut self,
        module: u32,
        shape: &Shape,
        args: &[RunnerArg],
        sample: &[u32],
        fills: &[(u64, u32)],
    ) -> Result<Vec<u64>, Failure> {
        let mut head = Self::head(4, module, shape, args);
        put_u32(&mut head, sample.len() as u32);
        for &b in sample {
            put_u32(&mut head, b);
        }
        for i in 0..args.len() {
            let (hi, width) = fills.get(i).copied().unwrap_or((0, 0));
            head.extend_from_slice(&hi.to_le_bytes());
            put_u32(&mut head, width);
        }
        self.send(&[&head])?;
        let deadline = Instant::now() + self.timeout;
        self.status(deadline)?;
        let n = self.read_u32(deadline)? as usize;
        if n > 1024 {
            return Err(self.died(&format!("it answered {n} counters")));
        }
        let bytes = self.read_bytes(8 * n, deadline)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect())
    }

    fn send(&mut self, parts: &[&[u8]]) -> Result<(), Failure> {
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(Failure::Died("the runner is gone".into()));
        };
        for p in parts {
            if stdin.write_all(p).is_err() {
                return Err(self.died("it stopped reading"));
            }
        }
        if stdin.flush().is_err() {
            return Err(self.died("it stopped reading"));
        }
        Ok(())
    }

    fn status(&mut self, deadline: Instant) -> Result<(), Failure> {
        match self.read_u32(deadline)? {
            0 => Ok(()),
            1 => {
                let n = self.read_u32(deadline)? as usize;
                let m = self.read_bytes(n, deadline)?;
                Err(Failure::Reported(String::from_utf8_lossy(&m).into_owned()))
            }
            s => Err(self.died(&format!("it answered {s}, not a status"))),
        }
    }

    fn read_u32(&mut self, deadline: Instant) -> Result<u32, Failure> {
        let b = self.read_bytes(4, deadline)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn read_bytes(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, Failure> {
        while self.pending.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(c) => self.pending.extend_from_slice(&c),
                Err(RecvTimeoutError::Timeout) => {
                    let secs = self.timeout.as_secs();
                    return Err(self.died(&format!(
                        "it did not answer within {secs} s (a hang: a thread spinning or waiting forever)"
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.died("it exited")),
            }
        }
        let rest = self.pending.split_off(n);
        Ok(std::mem::replace(&mut self.pending, rest))
    }

    /// Kill the runner (if still there) and describe why it is gone, with what its
    /// stderr says (the sanitizer's report).
    fn died(&mut self, why: &str) -> Failure {
        self.dead = true;
        self.stdin = None;
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        // Let the stderr reader drain what the runner wrote last.
        std::thread::sleep(Duration::from_millis(50));
        let err = self.stderr.lock().map(|e| e.clone()).unwrap_or_default();
        let text = String::from_utf8_lossy(&err);
        let mut msg = format!("the cuda-sim runner failed: {why}");
        if let Some(st) = status {
            use std::os::unix::process::ExitStatusExt;
            if let Some(sig) = st.signal().filter(|_| !why.contains("within")) {
                msg.push_str(&format!(" (killed by signal {sig}{})", signal_name(sig)));
            } else if let Some(c) = st.code() {
                msg.push_str(&format!(" (exit code {c})"));
            }
        }
        let report = summarize_report(&text);
        if !report.is_empty() {
            msg.push('\n');
            msg.push_str(&report);
        }
        Failure::Died(msg)
    }

    /// A runner a failed launch killed (a sanitizer's report, a crash, a hang) is
    /// started again, with nothing loaded, for the next launch of any session.
    pub fn revive(&mut self) -> Result<(), String> {
        if self.dead {
            *self = Runner::spawn(&self.program, self.mode, self.timeout)?;
        }
        Ok(())
    }

    /// Run one launch of the kernel object `object` (started again if it died, the
    /// object loaded if it is not yet).
    pub fn launch_object(&mut self, object: &Path, shape: &Shape, args: &[RunnerArg]) -> Result<Vec<Vec<u8>>, Failure> {
        self.revive().map_err(Failure::Died)?;
        let module = self.load(object)?;
        self.launch(module, shape, args)
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(&3u32.to_le_bytes());
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn put_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => ", SIGILL",
        6 => ", SIGABRT",
        7 => ", SIGBUS",
        8 => ", SIGFPE",
        9 => ", SIGKILL",
        11 => ", SIGSEGV: a bad address",
        _ => "",
    }
}

/// The lines of a sanitizer report that say what happened: the error line, graphc's
/// own context lines, the first frames, the summary; at most 40 lines.
pub fn summarize_report(text: &str) -> String {
    let mut keep = Vec::new();
    let mut frames = 0;
    let mut in_report = false;
    for line in text.lines() {
        let l = line.trim();
        let head = l.contains("ERROR: AddressSanitizer")
            || l.contains("WARNING: ThreadSanitizer")
            || l.contains("runtime error:")
            || l.starts_with("graphc-sim:")
            || l.starts_with("SUMMARY:");
        if head {
            in_report = true;
            frames = 0;
            keep.push(l.to_string());
        } else if in_report && (l.starts_with('#') && frames < 4) {
            frames += 1;
            keep.push(format!("  {l}"));
        } else if in_report && (l.starts_with("READ of") || l.starts_with("WRITE of") || l.contains(" is located ")) {
            keep.push(l.to_string());
        } else if in_report && (l.starts_with("Previous") || l.starts_with("Read of") || l.starts_with("Write of")) {
            frames = 0;
            keep.push(l.to_string());
        }
        if keep.len() >= 40 {
            break;
        }
    }
    keep.join("\n")
}

/// The runner of each runner executable, shared by every session of this process (a
/// runner keeps its fibers and loaded kernels; creating TSan's fiber contexts is what
/// costs most). One that a launch killed is started again by the next launch
/// ([`Runner::launch_object`]), so one session's failure is not another's.
pub fn shared(program: &Path, mode: Sanitize, timeout: Duration) -> Result<Arc<Mutex<Runner>>, String> {
    static RUNNERS: OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<Runner>>>>> = OnceLock::new();
    let mut map = RUNNERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(r) = map.get(program) {
        return Ok(Arc::clone(r));
    }
    let r = Arc::new(Mutex::new(Runner::spawn(program, mode, timeout)?));
    map.insert(program.to_path_buf(), Arc::clone(&r));
    Ok(r)
}
