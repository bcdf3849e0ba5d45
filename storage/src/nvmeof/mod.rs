//! NVMe over Fabrics on the RDMA transport, in user space over the verbs provider, in
//! the manner of SPDK's `lib/nvmf` and `lib/nvme`.
//!
//! * [`wire`] — the formats: CM private data, SQE/CQE, SGL descriptors, Fabrics, admin
//!   and NVM commands, Connect data, properties, Identify structures, log pages, status.
pub mod wire;
