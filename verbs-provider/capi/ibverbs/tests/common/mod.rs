//! Running unmodified Debian RDMA programs on our libraries: the library directory, the
//! server/client pair with bounded time, and what a test checks of their output.
#![allow(dead_code)]
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory with libibverbs.so.1 and its companions (debug build), built once per
/// test process by `scripts/build-rdma-libs --debug`.
pub fn library_directory() -> PathBuf {
    static DIRECTORY: OnceLock<PathBuf> = OnceLock::new();
    DIRECTORY
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..");
            let output = Command::new(root.join("scripts/build-rdma-libs"))
                .arg("--debug")
                .env("CARGO", env!("CARGO"))
                .output()
                .expect("run scripts/build-rdma-libs");
            assert!(
                output.status.success(),
                "scripts/build-rdma-libs failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let text = String::from_utf8_lossy(&output.stdout);
            PathBuf::from(text.lines().last().expect("the script prints the directory").trim())
        })
        .clone()
}

/// Held while a test runs RDMA programs: the tests take turns across test processes
/// (nextest runs them side by side), because a pair of programs with their progress
/// threads already fills a 2-core machine, and a peer that is not scheduled for long
/// enough makes the transport time out, as a stalled host would on hardware.
pub struct Turn(std::fs::File);

impl Drop for Turn {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this value owns.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Waits for this test's turn.
pub fn take_turn() -> Turn {
    use std::os::fd::AsRawFd;
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rdma-programs.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .expect("open the turn lock");
    // SAFETY: flock on a descriptor we own; it blocks until the other holder lets go.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(locked, 0, "flock {}", path.display());
    Turn(file)
}

/// Fails the test (with how to install it) when a Debian program is missing; CI installs
/// them (scripts/test). `RNIC_SKIP_RDMA_APPS=1` skips instead, for hosts without them.
pub fn require(program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var_os("RNIC_SKIP_RDMA_APPS").is_some() {
        eprintln!("{program} missing: skipped (RNIC_SKIP_RDMA_APPS)");
        return false;
    }
    panic!(
        "{program} is not installed: install the Debian packages ibverbs-utils perftest rdmacm-utils \
         (scripts/test does, as root), or set RNIC_SKIP_RDMA_APPS=1"
    );
}

/// A program on our libraries with `RNIC_DEVICE=device`.
pub fn command(program: &str, args: &[&str], device: &str) -> Command {
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LD_LIBRARY_PATH", library_directory())
        .env("RNIC_DEVICE", device)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A running program whose output is read as it comes (a program that prints more than
/// a pipe holds would otherwise block while the test waits for its peer).
pub struct Running {
    child: Child,
    stdout: std::thread::JoinHandle<Vec<u8>>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
    /// What the program wrote on stderr so far.
    stderr_so_far: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Running {
    /// Starts reading `child`'s output.
    pub fn new(mut child: Child) -> Self {
        use std::io::Read;
        use std::sync::{Arc, Mutex};
        fn drain(
            pipe: Option<impl Read + Send + 'static>,
            so_far: Arc<Mutex<Vec<u8>>>,
        ) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                if let Some(mut pipe) = pipe {
                    let mut chunk = [0u8; 4096];
                    while let Ok(length @ 1..) = pipe.read(&mut chunk) {
                        so_far.lock().expect("output lock").extend_from_slice(&chunk[..length]);
                    }
                }
                std::mem::take(&mut *so_far.lock().expect("output lock"))
            })
        }
        let stderr_so_far = Arc::new(Mutex::new(Vec::new()));
        let stdout = drain(child.stdout.take(), Arc::new(Mutex::new(Vec::new())));
        let stderr = drain(child.stderr.take(), stderr_so_far.clone());
        Self {
            child,
            stdout,
            stderr,
            stderr_so_far,
        }
    }

    /// Waits at most `limit` until the program has written `text` on stderr; whether it
    /// did.
    pub fn wait_for_stderr(&self, text: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let so_far = self.stderr_so_far.lock().expect("output lock");
            if String::from_utf8_lossy(&so_far).contains(text) {
                return true;
            }
            drop(so_far);
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// What the program has written on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stderr_so_far.lock().expect("output lock")).into_owned()
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits at most `limit`; kills the program past that (the test then fails on its
    /// status).
    pub fn wait(mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    // Its descendants first, while they can still be found by their parent:
                    // a worker that left the process group (fio's job calls setsid) would
                    // keep the output pipes open and the reading threads waiting.
                    for pid in descendants(self.child.id()) {
                        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    }
                    let _ = self.child.kill();
                    break self.child.wait().expect("reap the program");
                }
            }
        };
        Output {
            status,
            stdout: self.stdout.join().unwrap_or_default(),
            stderr: self.stderr.join().unwrap_or_default(),
        }
    }
}

/// Waits for `child` at most `limit`, reading its output meanwhile.
pub fn wait_bounded(child: Child, limit: Duration) -> Output {
    Running::new(child).wait(limit)
}

/// Both sides' output.
pub struct Pair {
    pub server: Output,
    pub client: Output,
}

impl Pair {
    /// Panics with both sides' output unless both exited 0.
    pub fn assert_success(&self, what: &str) {
        for (side, output) in [("server", &self.server), ("client", &self.client)] {
            assert!(
                output.status.success(),
                "{what}: {side} failed ({})\n--- server stdout\n{}\n--- server stderr\n{}\n--- client stdout\n{}\n--- client stderr\n{}",
                output.status,
                String::from_utf8_lossy(&self.server.stdout),
                String::from_utf8_lossy(&self.server.stderr),
                String::from_utf8_lossy(&self.client.stdout),
                String::from_utf8_lossy(&self.client.stderr),
            );
        }
    }

    /// The client's standard output.
    pub fn client_stdout(&self) -> String {
        String::from_utf8_lossy(&self.client.stdout).into_owned()
    }

    /// The server's standard output.
    pub fn server_stdout(&self) -> String {
        String::from_utf8_lossy(&self.server.stdout).into_owned()
    }
}

/// Runs `program` as server on `udp:server_ip` and as client on `udp:client_ip`, the
/// client given `server_args` + `client_args` + the server's host; 60 s at most each.
pub fn run_pair(program: &str, args: &[&str], server_ip: &str, client_ip: &str) -> Pair {
    let _turn = take_turn();
    let server = Running::new(
        command(program, args, &format!("udp:{server_ip}"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}")),
    );
    // The client gives up soon when nobody listens, and on a loaded host the server's
    // start (device bring-up) takes a while: wait until its TCP port listens.
    if let Some(port) = args.windows(2).find(|w| w[0] == "-p").and_then(|w| w[1].parse().ok()) {
        wait_for_listener(port, Duration::from_secs(30));
    } else {
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut client_args: Vec<&str> = args.to_vec();
    client_args.push("127.0.0.1");
    let client = command(program, &client_args, &format!("udp:{client_ip}"))
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let client = wait_bounded(client, Duration::from_secs(60));
    let server = server.wait(Duration::from_secs(10));
    Pair { server, client }
}

/// Waits until a TCP socket listens on `port` (`/proc/net/tcp`, state 0A), at most
/// `limit`.
pub fn wait_for_listener(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    let wanted = format!(":{port:04X} ");
    while Instant::now() < deadline {
        let listening = ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|path| {
            std::fs::read_to_string(path).is_ok_and(|table| {
                table.lines().skip(1).any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 3 && format!("{} ", &fields[1][fields[1].len() - 5..]) == wanted && fields[3] == "0A"
                })
            })
        });
        if listening {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The numbers of perftest's result line (the line after the `#bytes` header).
pub fn perftest_result(stdout: &str) -> Vec<f64> {
    let mut lines = stdout.lines().skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next();
    lines
        .next()
        .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default()
}

/// Every process below `pid` (children, their children, ...), from `/proc`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
        let ppid = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut found = vec![pid];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(parents.iter().filter(|&&(_, p)| p == parent).map(|&(c, _)| c));
        index += 1;
    }
    found.remove(0);
    found
}
