//! The SystemVerilog package `rnicvip_pkg` (checked in as
//! `verification/capi/include/rnicvip_pkg.sv`): the register map as SystemVerilog
//! constants — BARs and BAR0 registers, doorbell offsets, command and mailbox opcodes,
//! completion statuses, and the bit position and width of every field of every layout —
//! generated from `firmware-if`, so a testbench (or RTL) cannot drift from the model. A
//! test compares the file with [`render`]; `RNIC_UPDATE_DOCS=1 cargo test -p rnic-vip
//! sv_package` rewrites it.

use std::fmt::Write;

use rnic_firmware_if::cmdq::Opcode;
use rnic_firmware_if::cqe::CqeStatus;
use rnic_firmware_if::mailbox::MailboxOpcode;
use rnic_firmware_if::wqe::SqOpcode;
use rnic_firmware_if::{doorbell, pci, regs};

use crate::layout::layouts;

/// Field access on a layout held in a 2048-bit vector, and the end of the package.
const SET_AND_GET: &str = r#"
  // Sets bits lo..lo+width-1 of a layout held in a vector (bit 0 = bit 0 of byte 0).
  function automatic void set_field(inout bit [2047:0] layout, input int lo, input int width,
                                    input longint unsigned value);
    for (int i = 0; i < width; i++) layout[lo + i] = value[i];
  endfunction

  // Reads bits lo..lo+width-1 of a layout held in a vector.
  function automatic longint unsigned get_field(input bit [2047:0] layout, input int lo, input int width);
    longint unsigned value = 0;
    for (int i = 0; i < width; i++) value[i] = layout[lo + i];
    return value;
  endfunction
endpackage
"#;

/// The package text.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "// rnicvip_pkg: the rnic register map as SystemVerilog constants.\n\
         // Generated from firmware-if by rnic_vip::sv_package::render(); do not edit by hand\n\
         // (RNIC_UPDATE_DOCS=1 cargo test -p rnic-vip sv_package regenerates it).\n\
         // Field positions count bits from bit 0 of byte 0 of the little-endian structure\n\
         // (docs/register-map.md); set one with rnicvip_pkg::set_field.\n\
         package rnicvip_pkg;\n\n",
    );
    let _ = writeln!(out, "  // BARs");
    let _ = writeln!(out, "  localparam int CONTROL_BAR = {};", regs::CONTROL_BAR);
    let _ = writeln!(out, "  localparam int DOORBELL_BAR = {};", regs::DOORBELL_BAR);
    let _ = writeln!(out, "  localparam int MSIX_BAR = {};", regs::MSIX_BAR);
    let _ = writeln!(
        out,
        "  localparam longint MSIX_ENTRY_SIZE = 'h{:x};",
        regs::MSIX_ENTRY_SIZE
    );
    let _ = writeln!(
        out,
        "  localparam longint EVENT_INT_ENABLE_BASE = 'h{:x};",
        regs::EVENT_INT_ENABLE_BASE
    );
    let _ = writeln!(out, "  localparam longint DB_OFFSET = 'h{:x};", doorbell::DB_OFFSET);
    let _ = writeln!(
        out,
        "  localparam longint EQ_DB_OFFSET = 'h{:x};",
        doorbell::EQ_DB_OFFSET
    );
    let _ = writeln!(out, "\n  // BAR0 registers");
    for register in regs::REGISTERS {
        let _ = writeln!(
            out,
            "  localparam longint REG_{} = 'h{:x};",
            register.name, register.offset
        );
    }
    let _ = writeln!(out, "\n  // Configuration space");
    let _ = writeln!(out, "  localparam int CFG_COMMAND = 'h{:x};", pci::offset::COMMAND);
    let _ = writeln!(
        out,
        "  localparam int CFG_MSIX_CONTROL = 'h{:x};",
        pci::MSIX_CAPABILITY_OFFSET as usize + 2
    );
    let _ = writeln!(
        out,
        "  localparam int COMMAND_MEMORY_SPACE = 'h{:x};",
        pci::COMMAND_MEMORY_SPACE
    );
    let _ = writeln!(
        out,
        "  localparam int COMMAND_BUS_MASTER = 'h{:x};",
        pci::COMMAND_BUS_MASTER
    );
    let _ = writeln!(
        out,
        "  localparam int MSIX_CONTROL_ENABLE = 'h{:x};",
        pci::MSIX_CONTROL_ENABLE
    );
    let _ = writeln!(out, "\n  // Command-queue opcodes");
    for op in Opcode::ALL {
        let _ = writeln!(out, "  localparam int CMD_{op:?} = 'h{:x};", op as u16);
    }
    let _ = writeln!(out, "\n  // Mailbox opcodes");
    for op in MailboxOpcode::ALL {
        let _ = writeln!(out, "  localparam int MB_{op:?} = 'h{:x};", op as u8);
    }
    let _ = writeln!(out, "\n  // Send-queue opcodes (WQE OPCODE, send CQE opcode)");
    for op in SqOpcode::ALL {
        let _ = writeln!(out, "  localparam int SQ_{op:?} = 'h{:x};", op as u8);
    }
    let _ = writeln!(out, "\n  // CQE statuses");
    for status in CqeStatus::ALL {
        let _ = writeln!(out, "  localparam int CQE_{status:?} = 'h{:x};", status as u8);
    }
    let _ = writeln!(
        out,
        "\n  // Layouts: <Layout>_SIZE in bytes, <Layout>_<FIELD>_LO and _W in bits"
    );
    for layout in layouts() {
        let _ = writeln!(out, "  localparam int {}_SIZE = {};", layout.name, layout.size);
        for field in layout.fields {
            let _ = writeln!(
                out,
                "  localparam int {}_{}_LO = {}; localparam int {}_{}_W = {};",
                layout.name,
                field.name,
                field.lo,
                layout.name,
                field.name,
                field.width()
            );
        }
    }
    out.push_str(SET_AND_GET);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checked_in_sv_package_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../capi/include/rnicvip_pkg.sv");
        let text = render();
        if std::env::var_os("RNIC_UPDATE_DOCS").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        let current = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            current == text,
            "{path} is stale: RNIC_UPDATE_DOCS=1 cargo test -p rnic-vip sv_package"
        );
    }

    #[test]
    fn field_positions_in_the_package_are_the_layouts() {
        let text = render();
        assert!(text.contains("localparam int Qpc_SIZE = 256;"));
        let (_, dqpn) = crate::layout::field("Qpc", "DQPN").unwrap();
        assert!(text.contains(&format!("localparam int Qpc_DQPN_LO = {};", dqpn.lo)));
        assert!(text.contains("localparam longint REG_CSQ_PRODUCER_INDEX = 'h7010;"));
    }
}
