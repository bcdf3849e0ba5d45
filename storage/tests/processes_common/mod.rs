//! The harness of the cross-process tests: `rnic-emu serve` children on loopback UDP.
//!
//! A test binary runs the emulator as a child by re-running itself with its `#[ignore]`d
//! `emulator_child` test asked for by name (Cargo builds another package's binary only for
//! that package's tests); [`serve_if_asked`] is that test's body.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What tells one test binary's children and files from another's.
pub struct Names {
    /// The environment variable `SOCKET,NET,MAC` that makes `emulator_child` serve.
    pub child_env: &'static str,
    /// The prefix of scratch files in the temporary directory.
    pub scratch_prefix: &'static str,
    /// The first five bytes of the emulators' MAC addresses, `02:52:…:` form.
    pub mac_prefix: &'static str,
}

/// Runs `rnic-emu serve` if `child_env` is set (`SOCKET,NET,MAC`); returns otherwise.
pub fn serve_if_asked(names: &Names) {
    let Ok(spec) = std::env::var(names.child_env) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let overrides = rnic_emu::config::Overrides {
        socket: Some(parts[0].into()),
        net: Some(parts[1].into()),
        mac: Some(parts[2].into()),
        timing: None,
        pcap: None,
    };
    let options = rnic_emu::config::resolve(&rnic_emu::config::ConfigFile::default(), &overrides).unwrap();
    rnic_emu::os::install_termination_handlers().unwrap();
    rnic_emu::vfio_user::Server::bind(options).unwrap().run().unwrap();
}

/// A child process killed and reaped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A path in the temporary directory, unique to this process.
pub fn scratch(names: &Names, name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}-{}-{name}", names.scratch_prefix, std::process::id()))
}

/// An emulator child serving on `127.0.0.n`.
pub struct Emulator {
    _child: Killed,
    socket: PathBuf,
    mac: String,
    n: u8,
}

impl Emulator {
    /// Starts the child and waits (at most 30 s) for its vfio-user socket.
    pub fn start(names: &Names, n: u8) -> Self {
        let socket = scratch(names, &format!("emu{n}.sock"));
        let mac = format!("{}:{n:02x}", names.mac_prefix);
        let _ = std::fs::remove_file(&socket);
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "emulator_child", "--ignored", "--nocapture"])
            .env(names.child_env, format!("{},udp:127.0.0.{n},{mac}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = Killed(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "emulator {n} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            _child: child,
            socket,
            mac,
            n,
        }
    }

    /// The `--device` argument of a tool that uses this emulator.
    pub fn device(&self) -> String {
        format!("vfio-user:{},mac={}", self.socket.display(), self.mac)
    }

    /// The emulator's IPv4 address.
    pub fn ip(&self) -> String {
        format!("127.0.0.{}", self.n)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
