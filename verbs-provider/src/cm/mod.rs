//! The connection manager: IB CM on QP1 with RDMA-CM addressing, the way Linux's `cm.c`
//! and `cma.c` do it over RoCE.

pub mod mad;
