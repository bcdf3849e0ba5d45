//! A session's configuration, from TOML or JSON text (the C ABI passes it as a
//! string, so one format serves every binding).
//!
//! ```toml
//! mac = "02:52:4e:49:43:01"
//! preset = "hns-100g"            # or hns-25g, ideal
//! timing = { pcie_lanes = 4 }    # any timing parameter (docs/timing.md)
//! memory = [{ base = 0x1000_0000, size = 0x100_0000 }]   # backdoor regions
//! trace = true                   # trace from creation (crate::trace)
//! record = true                  # record from creation (crate::replay)
//! ```

use std::collections::BTreeMap;

use rnic_hw_model::timing::TimingParams;
use rnic_hw_model::DeviceConfig;
use serde::{Deserialize, Serialize};

use crate::VipError;

/// A region of host memory the model owns (the testbench reaches it by backdoor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Region {
    /// First bus address (4 KiB aligned).
    pub base: u64,
    /// Bytes (a multiple of 4 KiB).
    pub size: u64,
}

/// What a session is created with. Every field is optional.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// The port's MAC address, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Timing preset: `hns-100g` (default), `hns-25g`, `ideal`.
    pub preset: String,
    /// Timing parameters overriding the preset's (names of `docs/timing.md`).
    pub timing: BTreeMap<String, u64>,
    /// Doorbell pages in BAR2.
    pub doorbell_pages: u32,
    /// Backdoor host memory regions (ignored when the testbench supplies host memory
    /// through callbacks, which must then be the only memory).
    pub memory: Vec<Region>,
    /// Trace from creation (as `Session::start_trace`).
    pub trace: bool,
    /// Record every input and output from creation (as `Session::start_recording`).
    pub record: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            mac: "02:52:4e:49:43:01".into(),
            preset: "hns-100g".into(),
            timing: BTreeMap::new(),
            doorbell_pages: DeviceConfig::default().doorbell_pages,
            memory: vec![Region {
                base: 0x1000_0000,
                size: 16 << 20,
            }],
            trace: false,
            record: false,
        }
    }
}

impl SessionConfig {
    /// Parses TOML, or JSON when the text starts with `{`. Empty text is the default.
    pub fn parse(text: &str) -> Result<Self, VipError> {
        let trimmed = text.trim_start();
        let config: SessionConfig = if trimmed.is_empty() {
            SessionConfig::default()
        } else if trimmed.starts_with('{') {
            serde_json::from_str(text).map_err(|e| VipError::Config(e.to_string()))?
        } else {
            toml::from_str(text).map_err(|e| VipError::Config(e.to_string()))?
        };
        config.device_config()?;
        Ok(config)
    }

    /// The configuration as JSON (for records and traces: the config travels with them).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The MAC address.
    pub fn mac_address(&self) -> Result<[u8; 6], VipError> {
        parse_mac(&self.mac)
    }

    /// The device configuration this session's device is built with.
    pub fn device_config(&self) -> Result<DeviceConfig, VipError> {
        let mut timing = TimingParams::preset(&self.preset).map_err(|e| VipError::Config(e.to_string()))?;
        for (name, value) in &self.timing {
            timing
                .set(&format!("{name}={value}"))
                .map_err(|e| VipError::Config(e.to_string()))?;
        }
        timing.validate().map_err(|e| VipError::Config(e.to_string()))?;
        if self.doorbell_pages == 0 || self.doorbell_pages > 1024 {
            return Err(VipError::Config(format!(
                "doorbell_pages {}: 1..=1024",
                self.doorbell_pages
            )));
        }
        for region in &self.memory {
            if region.base % 4096 != 0 || region.size % 4096 != 0 || region.size == 0 || region.size > 1 << 32 {
                return Err(VipError::Config(format!(
                    "memory region {:#x}+{:#x}: 4 KiB aligned, 4 KiB..4 GiB",
                    region.base, region.size
                )));
            }
            if region.base.checked_add(region.size).is_none() {
                return Err(VipError::Config(format!("memory region {:#x} wraps", region.base)));
            }
        }
        Ok(DeviceConfig {
            mac_address: self.mac_address()?,
            doorbell_pages: self.doorbell_pages,
            timing,
            ..DeviceConfig::default()
        })
    }
}

/// `aa:bb:cc:dd:ee:ff` as bytes.
pub fn parse_mac(text: &str) -> Result<[u8; 6], VipError> {
    let parts: Vec<&str> = text.split(':').collect();
    let bad = || VipError::Config(format!("MAC address {text:?}: six hex bytes separated by ':'"));
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_json_give_the_same_configuration() {
        let toml = "mac = \"02:00:00:00:00:07\"\npreset = \"ideal\"\ntiming = { pcie_lanes = 4 }\ntrace = true\n";
        let json = r#"{"mac": "02:00:00:00:00:07", "preset": "ideal", "timing": {"pcie_lanes": 4}, "trace": true}"#;
        let a = SessionConfig::parse(toml).unwrap();
        let b = SessionConfig::parse(json).unwrap();
        assert_eq!(a, b);
        let device = a.device_config().unwrap();
        assert_eq!(device.mac_address, [2, 0, 0, 0, 0, 7]);
        assert_eq!(device.timing.pcie_lanes, 4);
        assert_eq!(device.timing.pcie_read_latency_ps, 0, "the ideal preset");
    }

    #[test]
    fn mistakes_are_refused_with_the_reason() {
        for bad in [
            "nope = 1",
            "mac = \"02:00\"",
            "preset = \"hns-1t\"",
            "timing = { warp = 9 }",
            "memory = [{ base = 0x1001, size = 4096 }]",
            "{\"trace\": 3}",
        ] {
            let error = SessionConfig::parse(bad).unwrap_err();
            assert!(matches!(error, VipError::Config(_)), "{bad}: {error}");
        }
        assert_eq!(SessionConfig::parse("").unwrap(), SessionConfig::default());
    }
}
