//! Renders `docs/register-map.md` from the definitions in this crate, so a driver writer
//! in any language can work from one document that cannot drift from the code (a test
//! compares the file with [`render`]; `RNIC_UPDATE_DOCS=1 cargo test -p
//! rnic-firmware-if register_map` rewrites it).

use std::fmt::Write;

use crate::bits::Layout;
use crate::{caps, cmdq, context, cqe, doorbell, eqe, event, mailbox, regs, wqe};

fn layout_section<L: Layout>(out: &mut String, title: &str, note: &str) {
    let _ = writeln!(out, "### {title} — `{}` ({} bytes)\n", L::NAME, L::SIZE);
    if !note.is_empty() {
        let _ = writeln!(out, "{note}\n");
    }
    let _ = writeln!(out, "| Field | Bits | Width | Meaning |");
    let _ = writeln!(out, "|---|---|---|---|");
    let mut fields: Vec<_> = L::FIELDS.to_vec();
    fields.sort_by_key(|f| f.lo);
    for f in fields {
        let bits = if f.hi == f.lo {
            format!("{}", f.lo)
        } else {
            format!("{}:{}", f.hi, f.lo)
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            f.name,
            bits,
            f.width(),
            f.doc.trim().replace('|', "\\|")
        );
    }
    out.push('\n');
}

fn value_table<T: Copy + std::fmt::Debug>(out: &mut String, title: &str, values: &[T], raw: impl Fn(T) -> u64) {
    let _ = writeln!(out, "### {title}\n");
    let _ = writeln!(out, "| Value | Name |");
    let _ = writeln!(out, "|---|---|");
    for v in values {
        let _ = writeln!(out, "| {:#04x} | {:?} |", raw(*v), v);
    }
    out.push('\n');
}

/// The whole register map as Markdown.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "# rnic register map\n\n\
         Generated from `firmware-if` by `register_map::render()`; do not edit by hand \
         (`RNIC_UPDATE_DOCS=1 cargo test -p rnic-firmware-if register_map` regenerates it). \
         Bit ranges `hi:lo` count from bit 0 of byte 0 of the little-endian structure. \
         Deviations from hns are listed in `docs/hw-interface.md`.\n\n",
    );

    out.push_str("## 1. BARs\n\n| BAR | Size | Contents |\n|---|---|---|\n");
    let _ = writeln!(
        out,
        "| {} | {:#x} | control registers (§2) |",
        regs::CONTROL_BAR,
        regs::BAR0_SIZE
    );
    let _ = writeln!(
        out,
        "| {} | {:#x} × pages | doorbell pages (§3); page 0 is the driver's, page n may be given to a process |",
        regs::DOORBELL_BAR,
        regs::DOORBELL_PAGE_SIZE
    );
    let _ = writeln!(
        out,
        "| {} | {:#x} | MSI-X table at 0 ({} bytes per vector), PBA at {:#x} |\n",
        regs::MSIX_BAR,
        regs::MSIX_BAR_SIZE,
        regs::MSIX_ENTRY_SIZE,
        regs::MSIX_PBA_OFFSET
    );
    let _ = writeln!(
        out,
        "PCI identity: vendor {:#06x}, device {:#06x}, revision {:#04x}, class {:#08x}; PCIe capability at {:#x}, MSI-X capability at {:#x}; no INTx.\n",
        crate::pci::DEFAULT_VENDOR_ID,
        crate::pci::DEFAULT_DEVICE_ID,
        crate::pci::DEFAULT_REVISION_ID,
        crate::pci::CLASS_CODE,
        crate::pci::PCIE_CAPABILITY_OFFSET,
        crate::pci::MSIX_CAPABILITY_OFFSET
    );

    out.push_str("## 2. BAR0 registers (32-bit)\n\n| Offset | Name | Access | Meaning |\n|---|---|---|---|\n");
    for r in regs::REGISTERS {
        let _ = writeln!(
            out,
            "| {:#07x} | `{}` | {:?} | {} |",
            r.offset,
            r.name,
            r.access,
            r.doc.trim().replace('|', "\\|")
        );
    }
    let _ = writeln!(
        out,
        "| {:#07x} + 4·n | `EVENT_INT_ENABLE[n]` | ReadWrite | 1 enables the MSI-X vector of EQ n (n < {}) |\n",
        regs::EVENT_INT_ENABLE_BASE,
        regs::MAX_EVENT_INT_ENABLES
    );
    let _ = writeln!(
        out,
        "MSI-X vectors: {} = abnormal, then one per AEQ, then one per CEQ. EQ numbers: CEQs first (0..n), then the AEQ.\n",
        regs::ABNORMAL_VECTOR
    );

    out.push_str("## 3. Doorbells\n\n");
    let _ = writeln!(
        out,
        "Each {:#x}-byte page of BAR {} holds the queue doorbell at {:#x} and (page 0 only) the EQ doorbell at {:#x}. \
         Write one 64-bit store, or two 32-bit stores (low half first; the high half commits). \
         When the page is shared memory rather than trapped (a vfio-user client's sparse mmap), the \
         device samples the register: wait until it reads 0 before storing the next doorbell (the \
         device clears it when it takes one; a trapped access always reads 0).\n",
        doorbell::DB_PAGE_SIZE,
        regs::DOORBELL_BAR,
        doorbell::DB_OFFSET,
        doorbell::EQ_DB_OFFSET
    );
    let _ = writeln!(
        out,
        "Direct WQE (cap `DIRECT_WQE`, trapped pages only): the {}-byte SQ WQE, with `FLAG` and \
         `WQE_IDX` (= the new producer index) set in its first dword, written as 8-byte stores to \
         {:#x}..{:#x} of the page, then the SQ doorbell with `FLAG` set; the device takes the WQE \
         from the window instead of fetching it from the ring.\n",
        doorbell::DWQE_SIZE,
        doorbell::DWQE_OFFSET,
        doorbell::DWQE_OFFSET + doorbell::DWQE_SIZE
    );
    layout_section::<doorbell::Doorbell>(&mut out, "Queue doorbell (SQ, RQ, SRQ)", "");
    layout_section::<doorbell::CqDoorbell>(&mut out, "CQ doorbell (set CI, arm)", "");
    value_table(
        &mut out,
        "Doorbell commands (`CMD`)",
        &doorbell::DoorbellCommand::ALL,
        |v| v as u64,
    );
    layout_section::<doorbell::EqDoorbell>(&mut out, "EQ doorbell", "");
    value_table(
        &mut out,
        "EQ doorbell commands",
        &doorbell::EqDoorbellCommand::ALL,
        |v| v as u64,
    );

    out.push_str("## 4. Command queue\n\n");
    out.push_str(
        "Ring of 32-byte descriptors in host memory (`CSQ_BASE`, `CSQ_DEPTH` = descriptors / 8). \
         The driver fills descriptors from the producer index, sets `NEXT` on all but the last \
         descriptor of a command, writes `CSQ_PRODUCER_INDEX` and polls `CSQ_CONSUMER_INDEX`; \
         firmware writes `RETVAL` and the response into the same slots.\n\n",
    );
    layout_section::<cmdq::Descriptor>(&mut out, "Descriptor header", "Bytes 8..32 are the 24-byte payload.");
    out.push_str("### Descriptor flags\n\n| Bit | Name |\n|---|---|\n");
    for (name, flag) in cmdq::DescriptorFlags::all().iter_names() {
        let _ = writeln!(out, "| {} | {} |", flag.bits().trailing_zeros(), name);
    }
    out.push('\n');
    let codes: Vec<u16> = (0..=12).chain([0xFF]).collect();
    out.push_str("### Return codes (`RETVAL`)\n\n| Value | Name |\n|---|---|\n");
    for c in codes {
        let _ = writeln!(out, "| {} | {:?} |", c, cmdq::ReturnCode::from_raw(c));
    }
    out.push('\n');
    out.push_str("### Opcodes\n\n| Opcode | Name | Descriptors |\n|---|---|---|\n");
    for op in cmdq::Opcode::ALL {
        let _ = writeln!(out, "| {:#06x} | {:?} | {} |", op as u16, op, op.descriptor_count());
    }
    out.push('\n');
    layout_section::<cmdq::FirmwareVersion>(&mut out, "QueryFirmwareVersion response", "");
    layout_section::<cmdq::HardwareVersion>(&mut out, "QueryHardwareVersion response", "");
    layout_section::<cmdq::GlobalParam>(&mut out, "ConfigGlobalParam", "");
    layout_section::<cmdq::FunctionResourcesA>(&mut out, "QueryFunctionResources, descriptor A", "");
    layout_section::<cmdq::FunctionResourcesB>(&mut out, "QueryFunctionResources, descriptor B", "");
    layout_section::<cmdq::FunctionInfo>(&mut out, "QueryFunctionInfo response", "");
    layout_section::<caps::CapsA>(&mut out, "QueryCapabilities, descriptor A", "");
    layout_section::<caps::CapsB>(&mut out, "QueryCapabilities, descriptor B", "");
    layout_section::<caps::CapsC>(&mut out, "QueryCapabilities, descriptor C", "");
    layout_section::<caps::CapsD>(&mut out, "QueryCapabilities, descriptor D", "");
    layout_section::<caps::CapsE>(&mut out, "QueryCapabilities, descriptor E", "");
    out.push_str("### Capability flags\n\n| Bit | Name |\n|---|---|\n");
    for (name, flag) in caps::CapFlags::all().iter_names() {
        let _ = writeln!(out, "| {} | {} |", flag.bits().trailing_zeros(), name);
    }
    out.push('\n');
    layout_section::<cmdq::GidEntry>(&mut out, "ConfigGidTable", "");
    layout_section::<cmdq::SmacEntry>(&mut out, "ConfigSmacTable", "");
    layout_section::<cmdq::BaseAddressTableAttributes>(&mut out, "ConfigBaseAddressTableAttributes", "");
    layout_section::<cmdq::FunctionClear>(&mut out, "FunctionClear", "");

    out.push_str("## 5. Mailbox\n\n");
    layout_section::<mailbox::PostMailbox>(&mut out, "PostMailbox payload", "");
    layout_section::<mailbox::MailboxStatus>(&mut out, "QueryMailboxStatus response", "");
    out.push_str("### Mailbox completion status\n\n| Value | Name |\n|---|---|\n");
    for raw in 0..=7u8 {
        if let Some(c) = mailbox::MailboxCompletion::from_raw(raw) {
            let _ = writeln!(out, "| {raw} | {c:?} |");
        }
    }
    out.push('\n');
    out.push_str("### Mailbox opcodes\n\n| Opcode | Name | Tag | Parameters |\n|---|---|---|---|\n");
    for op in mailbox::MailboxOpcode::ALL {
        let params = match op.base_address_table() {
            Some((_, mailbox::BtCommand::Write, _)) => "in = base address of the level",
            Some((_, mailbox::BtCommand::Read, _)) => "out = mailbox receiving the u64 address",
            Some((_, mailbox::BtCommand::Destroy, _)) => "none",
            None => {
                let name = format!("{op:?}");
                if name.starts_with("Modify") {
                    "in = mailbox: context ‖ mask (mask bit 1 keeps the current bit)"
                } else if name.starts_with("Query") {
                    "out = mailbox receiving the context"
                } else if name.starts_with("Create") {
                    "in = mailbox holding the context"
                } else {
                    "none"
                }
            }
        };
        let _ = writeln!(out, "| {:#04x} | {:?} | object index | {} |", op as u8, op, params);
    }
    out.push('\n');

    out.push_str("## 6. Contexts\n\n");
    layout_section::<context::Qpc>(
        &mut out,
        "QP context",
        &format!(
            "Lives in the QPC table in host memory; created by MODIFY_QPC RESET→INIT. \
             QPN {} (SMI) is refused; QPN {} is the GSI QP: UD, Q_Key {:#010x} whatever \
             `QKEY_XRCD` holds.",
            context::SMI_QPN,
            context::GSI_QPN,
            context::GSI_QKEY
        ),
    );
    layout_section::<context::Cqc>(&mut out, "CQ context", "");
    layout_section::<context::Srqc>(&mut out, "SRQ context", "");
    layout_section::<context::Mpt>(&mut out, "MPT entry (memory region)", "Key = rotl32(index, 8).");
    layout_section::<context::Eqc>(
        &mut out,
        "EQ context",
        "Travels in the mailbox only; the device keeps it.",
    );

    out.push_str("## 7. Work queue entries\n\n");
    layout_section::<wqe::RcSqWqe>(&mut out, "RC/UC SQ WQE", "Bytes 32..64: two SGEs, inline data (≤ 32 bytes) or the atomic segment (swap/add u64 at 48, compare u64 at 56).");
    layout_section::<wqe::UdSqWqe>(
        &mut out,
        "UD SQ WQE",
        "Bytes 40..46 DMAC, 48..64 DGID; all SGEs in the extended SGE area.",
    );
    layout_section::<wqe::Sge>(
        &mut out,
        "Scatter/gather element",
        "RQ and SRQ WQEs are arrays of SGEs.",
    );
    value_table(&mut out, "SQ opcodes", &wqe::SqOpcode::ALL, |v| v as u64);

    out.push_str("## 8. Completions and events\n\n");
    layout_section::<cqe::Cqe>(
        &mut out,
        "CQE",
        "A 32-byte CQE is the first half; valid when OWNER ^ ((ci & depth) != 0).",
    );
    value_table(&mut out, "CQE status", &cqe::CqeStatus::ALL, |v| v as u64);
    value_table(&mut out, "Receive CQE opcodes", &cqe::RecvOpcode::ALL, |v| v as u64);
    layout_section::<eqe::Ceqe>(&mut out, "CEQE", "");
    layout_section::<eqe::Aeqe>(&mut out, "AEQE", "");
    layout_section::<eqe::AeqeMailbox>(&mut out, "AEQE, mailbox completion view (event 0x13)", "");
    value_table(&mut out, "Asynchronous event types", &event::AsyncEventType::ALL, |v| {
        v as u64
    });
    value_table(
        &mut out,
        "WQ catastrophic error sub-types (event 0x05)",
        &event::WqCatastrophicSubtype::ALL,
        |v| v as u64,
    );
    value_table(
        &mut out,
        "Local access violation sub-types (event 0x07)",
        &event::LocalAccessSubtype::ALL,
        |v| v as u64,
    );
    value_table(
        &mut out,
        "Doorbell overflow sub-types (event 0x12)",
        &event::DbOverflowSubtype::ALL,
        |v| v as u64,
    );
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn register_map_doc_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/register-map.md");
        let rendered = super::render();
        if std::env::var_os("RNIC_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &rendered).expect("write docs/register-map.md");
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == rendered,
            "docs/register-map.md is stale: run `RNIC_UPDATE_DOCS=1 cargo test -p rnic-firmware-if register_map`"
        );
    }
}
