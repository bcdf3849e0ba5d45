//! Mapping the model's virtual time onto the wall clock.
//!
//! The model runs on virtual picoseconds and only moves when told to
//! ([`Device::advance_to`]). The emulator offers two mappings:
//!
//! * **realtime** (default): virtual time follows the wall clock since the device was
//!   created. Before every access and on every loop pass the device is advanced to the
//!   elapsed wall time, so a command that takes 2 µs in the model completes about 2 µs
//!   after it was posted, as on hardware.
//! * **fast**: events run as soon as they are due — virtual time jumps straight to the
//!   next pending event, without waiting for the wall clock to get there. The model is as
//!   fast as the host CPU allows; virtual time stands still while the device is idle.

use std::time::{Duration, Instant};

use rnic_hw_model::time::Picoseconds;
use rnic_hw_model::Device;

/// How virtual time relates to wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TimingMode {
    /// Virtual time follows the wall clock.
    #[default]
    Realtime,
    /// Events run as soon as they are due (flat out).
    Fast,
}

impl std::fmt::Display for TimingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimingMode::Realtime => "realtime",
            TimingMode::Fast => "fast",
        })
    }
}

/// Events run per [`Clock::sync`] in fast mode at most, so a device that keeps
/// scheduling work cannot starve the socket and the doorbell poller.
pub const FAST_BATCH: usize = 4096;

/// Keeps a device's virtual time in step with the chosen [`TimingMode`].
#[derive(Debug, Clone)]
pub struct Clock {
    mode: TimingMode,
    /// Wall instant at which the device's virtual time was `base`.
    epoch: Instant,
    base: Picoseconds,
}

fn picoseconds(duration: Duration) -> Picoseconds {
    Picoseconds(
        u64::try_from(duration.as_nanos())
            .unwrap_or(u64::MAX / 1000)
            .saturating_mul(1000),
    )
}

impl Clock {
    /// A clock for a device whose virtual time is `device_now` at this instant.
    pub fn new(mode: TimingMode, device_now: Picoseconds) -> Self {
        Self {
            mode,
            epoch: Instant::now(),
            base: device_now,
        }
    }

    /// The mode.
    pub fn mode(&self) -> TimingMode {
        self.mode
    }

    /// Restarts the mapping for a device whose time is now `device_now` (after the
    /// device was rebuilt by a reset).
    pub fn rebase(&mut self, device_now: Picoseconds) {
        self.epoch = Instant::now();
        self.base = device_now;
    }

    /// The virtual instant the wall clock says it is (realtime mode).
    fn wall_target(&self) -> Picoseconds {
        self.base.saturating_add(picoseconds(self.epoch.elapsed()))
    }

    /// Brings the device up to date: in realtime mode, runs every event due by the
    /// elapsed wall time and moves virtual time there; in fast mode runs up to
    /// [`FAST_BATCH`] pending events, whenever they are due. Returns whether any event
    /// ran.
    pub fn sync(&self, device: &mut Device) -> bool {
        match self.mode {
            TimingMode::Realtime => {
                let target = self.wall_target();
                if target <= device.now() {
                    return false;
                }
                let ran = device.next_event_time().is_some_and(|t| t <= target);
                device.advance_to(target);
                ran
            }
            TimingMode::Fast => {
                let mut ran = false;
                for _ in 0..FAST_BATCH {
                    let Some(next) = device.next_event_time() else { break };
                    device.advance_to(next.max(device.now()));
                    ran = true;
                }
                ran
            }
        }
    }

    /// How long the loop may sleep before the device's next event is due: `None` when
    /// nothing is pending, zero when something is due now (or in fast mode).
    pub fn until_next_event(&self, device: &Device) -> Option<Duration> {
        let next = device.next_event_time()?;
        Some(match self.mode {
            TimingMode::Fast => Duration::ZERO,
            TimingMode::Realtime => {
                let now = self.wall_target();
                Duration::from_nanos(next.0.saturating_sub(now.0) / 1000)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rnic_hw_model::memory::PagedMemory;
    use rnic_hw_model::{interrupt::RecordingSink, DeviceConfig};
    use std::sync::Arc;

    fn device() -> Device {
        Device::new(
            DeviceConfig::default(),
            Arc::new(PagedMemory::new()),
            Box::new(RecordingSink::new()),
        )
    }

    #[test]
    fn realtime_follows_the_wall_clock() {
        let mut device = device();
        let clock = Clock::new(TimingMode::Realtime, device.now());
        std::thread::sleep(Duration::from_millis(2));
        clock.sync(&mut device);
        assert!(device.now() >= Picoseconds::from_millis(2));
        assert!(device.now() < Picoseconds::from_millis(2000));
    }

    #[test]
    fn fast_mode_leaves_idle_time_alone() {
        let mut device = device();
        let clock = Clock::new(TimingMode::Fast, device.now());
        std::thread::sleep(Duration::from_millis(1));
        assert!(!clock.sync(&mut device));
        assert_eq!(device.now(), Picoseconds::ZERO);
        assert_eq!(clock.until_next_event(&device), None);
    }
}
