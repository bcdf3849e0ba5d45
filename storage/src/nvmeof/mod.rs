//! NVMe over Fabrics on the RDMA transport, in user space over the verbs provider, in
//! the manner of SPDK's `lib/nvmf` and `lib/nvme`.
//!
//! * [`wire`] — the formats: CM private data, SQE/CQE, SGL descriptors, Fabrics, admin
//!   and NVM commands, Connect data, properties, Identify structures, log pages, status.
//! * [`target`] — the target: discovery and NVM subsystems, controllers, queues.
//! * [`host`] — the host: discovery, a controller's queues, I/O, keep-alive, reconnect.
//! * [`perf`] — a benchmark workload on a host (queue depth, mix, pattern, verify).
pub mod host;
pub mod perf;
pub mod target;
pub mod wire;
