//! Address handles (`ibv_ah`): a software object holding where UD sends go — the
//! destination GID and MAC, the source GID index and the IP-level attributes. Nothing is
//! sent to the device; a UD send copies these into its WQE.

use std::fmt;
use std::sync::Arc;

use super::context::{check_port, Gid, PORT_NUMBER};
use super::error::{DestroyError, Result, VerbsError};
use super::pd::{PdInner, ProtectionDomain};

/// Largest service level (hns: SL ≤ 7).
pub const MAX_SERVICE_LEVEL: u8 = 7;

/// `ibv_ah_attr` with the `ibv_global_route` fields flattened (RoCE always uses a GRH),
/// plus the resolved destination MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttributes {
    /// Destination GID (`grh.dgid`).
    pub dgid: Gid,
    /// Flow label (`grh.flow_label`, 20 bits).
    pub flow_label: u32,
    /// Source GID index (`grh.sgid_index`).
    pub sgid_index: u8,
    /// Hop limit / TTL (`grh.hop_limit`).
    pub hop_limit: u8,
    /// Traffic class (`grh.traffic_class`; DSCP = tc >> 2 for RoCEv2).
    pub traffic_class: u8,
    /// Destination MAC. All zero: derived from a link-local `dgid` when possible.
    pub dmac: [u8; 6],
    /// Service level (`sl`, 0..=7).
    pub sl: u8,
    /// Static rate (`static_rate`, 0 = port rate).
    pub static_rate: u8,
    /// Port (`port_num`, must be 1).
    pub port_num: u8,
}

impl Default for AhAttributes {
    fn default() -> Self {
        Self {
            dgid: Gid::default(),
            flow_label: 0,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            dmac: [0; 6],
            sl: 0,
            static_rate: 0,
            port_num: PORT_NUMBER,
        }
    }
}

impl AhAttributes {
    /// Checks the attributes against a GID table of `gid_table_length` entries and fills
    /// in the destination MAC of a link-local destination when none was given.
    pub(crate) fn validated(&self, gid_table_length: usize) -> Result<Self> {
        check_port(self.port_num)?;
        if usize::from(self.sgid_index) >= gid_table_length {
            return Err(VerbsError::InvalidArgument(format!(
                "sgid_index {} beyond the GID table of {gid_table_length}",
                self.sgid_index
            )));
        }
        if self.sl > MAX_SERVICE_LEVEL {
            return Err(VerbsError::InvalidArgument(format!(
                "service level {} above {MAX_SERVICE_LEVEL}",
                self.sl
            )));
        }
        if self.flow_label >= 1 << 20 {
            return Err(VerbsError::InvalidArgument(format!(
                "flow label {:#x} wider than 20 bits",
                self.flow_label
            )));
        }
        let mut resolved = *self;
        if resolved.dmac == [0; 6] {
            if let Some(mac) = self.dgid.link_local_mac() {
                resolved.dmac = mac;
            }
        }
        Ok(resolved)
    }
}

/// An address handle.
pub struct AddressHandle {
    pub(crate) pd: Arc<PdInner>,
    attributes: AhAttributes,
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("pdn", &self.pd.pdn)
            .field("attributes", &self.attributes)
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_create_ah`.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a bad port, GID index, service level or flow
    /// label.
    pub fn create_ah(&self, attributes: &AhAttributes) -> Result<AddressHandle> {
        let gid_table_length = self.inner.context.info.gids.len();
        let attributes = attributes.validated(gid_table_length)?;
        self.inner.context.lock().address_handles += 1;
        Ok(AddressHandle {
            pd: self.inner.clone(),
            attributes,
        })
    }
}

impl AddressHandle {
    /// The attributes, with the destination MAC resolved.
    pub fn attributes(&self) -> &AhAttributes {
        &self.attributes
    }

    /// The PD number.
    pub fn pd_number(&self) -> u32 {
        self.pd.pdn
    }

    /// `ibv_destroy_ah`.
    ///
    /// # Errors
    /// Never fails today; the signature matches the other destroys.
    pub fn destroy(self) -> Result<(), DestroyError<Self>> {
        drop(self);
        Ok(())
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        let mut state = self.pd.context.lock();
        state.address_handles = state.address_handles.saturating_sub(1);
    }
}
