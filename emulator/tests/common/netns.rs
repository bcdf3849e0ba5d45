//! Network namespaces for the tests that need them: `ip` (iproute2), a guard for two
//! namespaces joined by a veth pair, the root/`ip` check (RNIC_SKIP_NETNS=1 skips), and
//! the capture check (`rnic-pcap-check`, with `../shared/oracles/check-roce-pcap` as a
//! second opinion where it exists).
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// Runs `ip ARGS`, panicking with its stderr on failure; returns its stdout.
pub fn ip(args: &[&str]) -> String {
    let output = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run ip {args:?}: {error}"));
    assert!(
        output.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Two namespaces joined by a veth pair; deleted on drop (which removes the veth too).
pub struct Namespaces {
    pub names: [String; 2],
    pub links: [String; 2],
}

impl Namespaces {
    /// Namespaces `{name}-a-PID`/`{name}-b-PID`, links `{link}a…`/`{link}b…` (both up),
    /// named after this process's id. `link` is at most 6 characters (IFNAMSIZ).
    pub fn create(name: &str, link: &str) -> Self {
        let id = std::process::id();
        let guard = Self {
            names: [format!("{name}-a-{id}"), format!("{name}-b-{id}")],
            // IFNAMSIZ: at most 15 characters.
            links: [
                format!("{link}a{}", id % 1_000_000),
                format!("{link}b{}", id % 1_000_000),
            ],
        };
        let [na, nb] = &guard.names;
        let [la, lb] = &guard.links;
        ip(&["netns", "add", na]);
        ip(&["netns", "add", nb]);
        ip(&[
            "link", "add", la, "netns", na, "type", "veth", "peer", "name", lb, "netns", nb,
        ]);
        ip(&["-n", na, "link", "set", la, "up"]);
        ip(&["-n", nb, "link", "set", lb, "up"]);
        guard
    }

    /// Gives the kernel of namespace `side` (0 or 1) the address `cidr` on its link.
    pub fn add_address(&self, side: usize, cidr: &str) {
        ip(&["-n", &self.names[side], "addr", "add", cidr, "dev", &self.links[side]]);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Root and `ip`, or a clear failure (or a skip with RNIC_SKIP_NETNS=1). `test` names
/// the test in the messages.
pub fn environment_ready(test: &str) -> bool {
    let root = is_root();
    let has_ip = Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success());
    if root && has_ip {
        return true;
    }
    let why = match (root, has_ip) {
        (false, _) => "needs root (network namespaces and CAP_NET_RAW)",
        _ => "needs the `ip` command (iproute2)",
    };
    if std::env::var("RNIC_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("skipped: the {test} test {why} (RNIC_SKIP_NETNS=1)");
        return false;
    }
    panic!("the {test} test {why}; run as root, or set RNIC_SKIP_NETNS=1 to skip it");
}

/// Whether we run as root, from /proc (no libc call needed in a test).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    })
}

/// Checks the capture at `pcap` with the project's checker (and the shared oracle where
/// it exists), panicking with its report unless it passed; returns the RoCEv2 frame count.
pub fn check_capture(pcap: &Path) -> u64 {
    let report = rnic_pcap_check::check_file(pcap, &rnic_pcap_check::CheckOptions::default())
        .unwrap_or_else(|error| panic!("cannot check {}: {error}", pcap.display()));
    eprintln!("{report}");
    assert!(report.passed(), "{report}\n(capture kept at {})", pcap.display());
    report.roce_frames
}
