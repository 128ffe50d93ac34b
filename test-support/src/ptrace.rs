//! Fixture processes driven phase by phase, and what their probed
//! instructions look like in memory.
use std::{
    io::{BufRead, BufReader, Write},
    process::ChildStdin,
    process::{Child, Command, Stdio},
    sync::mpsc::{channel, Receiver},
    thread,
    time::{Duration, Instant},
};

/// What a uprobe writes over the first byte of a probed instruction.
pub const BREAKPOINT: u8 = 0xcc;

/// A fixture process driven phase by phase (`--pause-before`).
pub struct Stepped {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Stepped {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn fixture");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self { child, stdin, lines, seen: Vec::new() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line starting with `prefix` (the ones before it are kept).
    pub fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => panic!("no line starting {prefix:?}; output so far: {:?}", self.seen),
            }
        }
    }

    /// Lets the process run its next phase.
    pub fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"\n").and_then(|_| stdin.flush()).expect("resume the fixture");
    }

    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait")
    }
}

impl Drop for Stepped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name=value` out of a fixture's line.
pub fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
        .to_string()
}

/// The first byte of `symbol` in the file whose name starts with `library`, as process
/// `pid` has it in memory now, and as the file has it on disk.
pub fn entry_bytes(pid: u32, library: &str, symbol: &str) -> (u8, u8) {
    use object::{Object, ObjectSegment, ObjectSymbol};
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let (base, path) = maps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = *f.get(5)?;
            let name = path.rsplit('/').next()?;
            if !name.starts_with(library) || u64::from_str_radix(f[2], 16).ok()? != 0 {
                return None;
            }
            Some((u64::from_str_radix(f[0].split('-').next()?, 16).ok()?, path.to_string()))
        })
        .unwrap_or_else(|| panic!("pid {pid} does not map {library}"));
    let data = std::fs::read(&path).expect("read the library");
    let file = object::File::parse(&*data).expect("ELF");
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(symbol) && s.is_definition())
        .unwrap_or_else(|| panic!("{symbol} not in {path}"));
    // Shared objects built here load their first segment at address 0, so a
    // symbol's address is its offset from the mapping at file offset 0.
    let first_segment = ObjectSegment::address(&file.segments().next().expect("a segment"));
    assert_eq!(first_segment, 0, "{path}: first segment not at 0");
    let on_disk = {
        use object::ObjectSection;
        let section = file.section_by_index(sym.section_index().expect("section")).expect("section");
        let (offset, _) = section.file_range().expect("file range");
        data[(offset + sym.address() - section.address()) as usize]
    };
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open /proc/PID/mem");
    mem.seek(SeekFrom::Start(base + sym.address())).expect("seek");
    let mut byte = [0u8; 1];
    mem.read_exact(&mut byte).expect("read process memory");
    (byte[0], on_disk)
}

/// Polls until process `pid`'s `cuLaunchKernel` is (or is not) trapped.
pub fn wait_trapped(pid: u32, trapped: bool, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (byte, _) = entry_bytes(pid, "libcuda.so.1", "cuLaunchKernel");
        if (byte == BREAKPOINT) == trapped {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "pid {pid}: cuLaunchKernel {} within {within:?} (first byte {byte:#x})",
            if trapped { "not trapped" } else { "still trapped" }
        );
        thread::sleep(Duration::from_millis(20));
    }
}
