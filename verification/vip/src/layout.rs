//! The driver↔device layouts of `firmware-if` by name, so that a testbench in another
//! language (SystemVerilog through the C ABI, Python) builds descriptors, contexts and
//! WQEs field by field from the same table `docs/register-map.md` is generated from.

use rnic_firmware_if::bits::{Field, Layout};
use rnic_firmware_if::{caps, cmdq, context, cqe, doorbell, eqe, mailbox, wqe};

use crate::VipError;

/// Name, size in bytes and fields of a layout.
#[derive(Debug, Clone, Copy)]
pub struct LayoutInfo {
    /// The layout's name (`Qpc`, `Cqe`, `RcSqWqe`…).
    pub name: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Its fields.
    pub fields: &'static [Field],
}

fn info<L: Layout>() -> LayoutInfo {
    LayoutInfo {
        name: L::NAME,
        size: L::SIZE,
        fields: L::FIELDS,
    }
}

/// Every layout a testbench can address by name.
pub fn layouts() -> Vec<LayoutInfo> {
    vec![
        info::<cmdq::Descriptor>(),
        info::<cmdq::HardwareVersion>(),
        info::<cmdq::FirmwareVersion>(),
        info::<cmdq::GlobalParam>(),
        info::<cmdq::FunctionInfo>(),
        info::<cmdq::FunctionResourcesA>(),
        info::<cmdq::FunctionResourcesB>(),
        info::<cmdq::BaseAddressTableAttributes>(),
        info::<cmdq::GidEntry>(),
        info::<cmdq::SmacEntry>(),
        info::<cmdq::FunctionClear>(),
        info::<caps::CapsA>(),
        info::<caps::CapsB>(),
        info::<caps::CapsC>(),
        info::<caps::CapsD>(),
        info::<caps::CapsE>(),
        info::<mailbox::PostMailbox>(),
        info::<mailbox::MailboxStatus>(),
        info::<doorbell::Doorbell>(),
        info::<doorbell::CqDoorbell>(),
        info::<doorbell::EqDoorbell>(),
        info::<context::Qpc>(),
        info::<context::Cqc>(),
        info::<context::Srqc>(),
        info::<context::Mpt>(),
        info::<context::Eqc>(),
        info::<wqe::RcSqWqe>(),
        info::<wqe::UdSqWqe>(),
        info::<wqe::Sge>(),
        info::<cqe::Cqe>(),
        info::<eqe::Ceqe>(),
        info::<eqe::Aeqe>(),
        info::<eqe::AeqeMailbox>(),
    ]
}

/// The layout called `name`.
pub fn layout(name: &str) -> Result<LayoutInfo, VipError> {
    layouts()
        .into_iter()
        .find(|l| l.name == name)
        .ok_or_else(|| VipError::Invalid(format!("no layout {name:?}")))
}

/// Field `field` of layout `layout`.
pub fn field(layout_name: &str, field_name: &str) -> Result<(LayoutInfo, Field), VipError> {
    let info = layout(layout_name)?;
    let field = info
        .fields
        .iter()
        .find(|f| f.name == field_name)
        .copied()
        .ok_or_else(|| VipError::Invalid(format!("layout {layout_name} has no field {field_name:?}")))?;
    Ok((info, field))
}

/// Sets `field` of `layout` in `bytes` (which must hold the whole layout) to `value`
/// (bits above the field's width are an error, not silently dropped).
pub fn set_field(bytes: &mut [u8], layout_name: &str, field_name: &str, value: u64) -> Result<(), VipError> {
    let (info, field) = field(layout_name, field_name)?;
    if bytes.len() < info.size {
        return Err(VipError::Invalid(format!(
            "{} bytes for {layout_name}: it has {}",
            bytes.len(),
            info.size
        )));
    }
    if value > field.max_value() {
        return Err(VipError::Invalid(format!(
            "{layout_name}.{field_name} = {value:#x}: the field has {} bits",
            field.width()
        )));
    }
    field.set(bytes, value);
    Ok(())
}

/// Reads `field` of `layout` from `bytes`.
pub fn get_field(bytes: &[u8], layout_name: &str, field_name: &str) -> Result<u64, VipError> {
    let (info, field) = field(layout_name, field_name)?;
    if bytes.len() < info.size {
        return Err(VipError::Invalid(format!(
            "{} bytes for {layout_name}: it has {}",
            bytes.len(),
            info.size
        )));
    }
    Ok(field.get(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_set_by_name_reads_back_through_the_typed_accessor() {
        let mut bytes = [0u8; 256];
        set_field(&mut bytes, "Qpc", "DQPN", 0x12_3456).unwrap();
        let qpc = context::Qpc(bytes);
        assert_eq!(qpc.destination_qpn(), 0x12_3456);
        assert_eq!(get_field(&bytes, "Qpc", "DQPN").unwrap(), 0x12_3456);
    }

    #[test]
    fn unknown_names_short_buffers_and_wide_values_are_refused() {
        let mut bytes = [0u8; 8];
        assert!(set_field(&mut bytes, "Nope", "X", 1).is_err());
        assert!(set_field(&mut bytes, "Qpc", "DQPN", 1).is_err(), "8 bytes for a QPC");
        let mut sge = [0u8; 16];
        assert!(set_field(&mut sge, "Sge", "NOPE", 1).is_err());
        let width = field("Qpc", "DQPN").unwrap().1.width();
        let mut qpc = [0u8; 256];
        assert!(set_field(&mut qpc, "Qpc", "DQPN", 1 << width).is_err());
    }

    #[test]
    fn every_layout_has_a_distinct_name() {
        let mut names: Vec<_> = layouts().iter().map(|l| l.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), layouts().len());
    }
}
