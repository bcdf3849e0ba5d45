//! `rnic-vip`: the verification IP's command line (coverage merge and report, trace
//! export, replay). See `docs/guides/verification.md`.

fn main() {
    eprintln!("rnic-vip: no command yet");
    std::process::exit(2);
}
