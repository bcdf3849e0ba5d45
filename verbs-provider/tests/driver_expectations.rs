//! What a driver may expect of the device beyond the happy path: behaviours first found
//! wrong from the driver's side and fixed in the model.

use rnic_firmware_if::mailbox::{ContextTable, MailboxCompletion, MailboxOpcode};
use rnic_verbs::backend::EmbeddedDevice;
use rnic_verbs::driver::{Driver, DriverConfig};
use rnic_verbs::Context;

/// hns numbers the AEQ right after the CEQs the driver created (EQN = number of CEQs), so
/// a driver that uses fewer completion vectors than the device offers gives its AEQ a
/// lower number; the device accepts it and keeps the AEQ on the AEQ vector.
#[test]
fn fewer_completion_vectors_than_the_device_offers() {
    let device = EmbeddedDevice::new();
    let config = DriverConfig {
        max_completion_vectors: 2,
        ..DriverConfig::default()
    };
    let context = Context::open_with_config(Box::new(device), &config).expect("bring-up");
    assert_eq!(context.num_comp_vectors(), 2);
    let cq = context.create_cq(64, None, 1).unwrap();
    assert_eq!(cq.query().unwrap().comp_vector, 1);
}

/// Querying a context that was never created fails with InvalidState, for MPT entries as
/// for CQs and SRQs.
#[test]
fn querying_an_unused_mpt_entry_is_refused_like_other_contexts() {
    let device = EmbeddedDevice::new();
    let mut driver = Driver::bring_up(Box::new(device), &DriverConfig::default()).unwrap();
    driver.context_get(ContextTable::Cqc, 3).unwrap();
    driver.context_get(ContextTable::Mpt, 3).unwrap();
    let cq = driver.mailbox_query(MailboxOpcode::QueryCqc, 3, 64).unwrap_err();
    assert_eq!(cq.completion(), Some(MailboxCompletion::InvalidState));
    let mpt = driver.mailbox_query(MailboxOpcode::QueryMpt, 3, 64).unwrap_err();
    assert_eq!(mpt.completion(), Some(MailboxCompletion::InvalidState));
}
