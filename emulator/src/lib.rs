//! # rnic-emu — the rnic device model as a separate process
//!
//! The `rnic-emu` binary has two jobs:
//!
//! * `rnic-emu` / `rnic-emu demo` (the default): bring up two embedded NICs in-process
//!   and print what they report (`rnic_verbs::demo`);
//! * `rnic-emu serve --socket PATH`: run one NIC as a **vfio-user PCI device** that
//!   QEMU 10.1+ (`vfio-user-pci`) or a user-space driver attaches to
//!   ([`vfio_user::Server`]).
//!
//! The library part exists so the integration tests can run the server in-process.
//! Modules: [`vfio_user`] (the protocol server), [`os`] (the OS layer, re-exported from
//! `rnic-os`, the project's one home for `unsafe`: memfd, mmap, SCM_RIGHTS, ppoll),
//! [`timing`] (virtual ↔ wall time), [`config`] (the TOML file), [`pcap`] (`--pcap`),
//! [`net`] (`--net`: the network backends). See `docs/guides/emulator.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub use rnic_net as net;
pub mod os;
pub mod pcap;
pub mod timing;
pub mod vfio_user;
