//! NVMe over Fabrics on the RDMA transport, in user space over the verbs provider, in
//! the manner of SPDK's `lib/nvmf` and `lib/nvme`.
//!
//! * [`wire`] — the formats: CM private data, SQE/CQE, SGL descriptors, Fabrics, admin
//!   and NVM commands, Connect data, properties, Identify structures, log pages, status.
//! * [`target`] — the target: discovery and NVM subsystems, controllers, queues.
//! * [`host`] — the host: discovery, a controller's queues, I/O, keep-alive, reconnect.
//! * [`config`] — a target's TOML file and command-line namespace specs.
//! * [`embedded`] — a target and hosts on embedded NICs of one fabric, in one process.
//! * [`perf`] — a benchmark workload on a host (queue depth, mix, pattern, verify).
pub mod config;
pub mod embedded;
pub mod host;
pub mod perf;
pub mod target;
pub mod wire;
