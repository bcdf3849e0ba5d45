//! Mailbox execution: decode a posted mailbox command, move its context between the
//! mailbox buffer and the object engines, and report completion.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Cqc, Eqc, Mpt, Qpc, Srqc};
use rnic_firmware_if::mailbox::{BtCommand, ContextTable, MailboxCompletion, MailboxOpcode, PostMailbox};

use super::Rejection;
use crate::device::{Device, Event};
use crate::diagnostics::Source;
use crate::eq::EqKind;
use crate::time::Picoseconds;

/// What a successful mailbox command hands back in its out-parameter mailbox.
enum Output {
    None,
    Bytes(Vec<u8>),
}

impl Device {
    /// Completes the mailbox command at the head of the queue.
    pub(crate) fn complete_mailbox(&mut self) {
        self.forget_context_caches();
        let Some(post) = self.firmware.mailbox_queue.pop_front() else {
            return;
        };
        let tag = post.tag();
        let result = match MailboxOpcode::from_raw(post.command()) {
            Some(opcode) => self
                .execute_mailbox(opcode, &post)
                .map_err(|rejection| (Some(opcode), rejection)),
            None => Err((
                None,
                Rejection {
                    status: MailboxCompletion::UnknownCommand,
                    field: "CMD",
                    value: post.command() as u64,
                    expected: "a mailbox opcode listed in docs/register-map.md".into(),
                },
            )),
        };
        // The command's context changes reach host memory before it completes.
        self.write_back_contexts();
        let status = match result {
            Ok(()) => MailboxCompletion::Success,
            Err((opcode, rejection)) => {
                let object = match opcode {
                    Some(op) => format!("mailbox {op:?} tag {tag:#x}"),
                    None => format!("mailbox command {:#x} tag {tag:#x}", post.command()),
                };
                self.diagnose(
                    Source::Mailbox,
                    object,
                    rejection.field,
                    rejection.value,
                    rejection.expected,
                );
                rejection.status
            }
        };
        self.firmware.last_mailbox_status = status;
        self.counters.mailbox_commands += 1;
        if post.event_enable() {
            self.post_mailbox_event(post.token(), status as u8, post.out_param());
        }
        if !self.firmware.mailbox_queue.is_empty() {
            let delay = Picoseconds(self.config.timing.mailbox_ps);
            self.scheduler.schedule_in(delay, Event::MailboxComplete);
        }
    }

    fn read_mailbox<L: Layout>(&mut self, address: u64, field: &'static str) -> Result<L, Rejection> {
        let mut value = L::zeroed();
        self.dma_read(address, value.bytes_mut())
            .map_err(|e| Rejection::dma(field, address, e))?;
        Ok(value)
    }

    fn read_mailbox_pair<L: Layout>(&mut self, address: u64) -> Result<(L, L), Rejection> {
        let context = self.read_mailbox::<L>(address, "IN_PARAM")?;
        let mask = self.read_mailbox::<L>(address.wrapping_add(L::SIZE as u64), "IN_PARAM")?;
        Ok((context, mask))
    }

    fn execute_mailbox(&mut self, opcode: MailboxOpcode, post: &PostMailbox) -> Result<(), Rejection> {
        use MailboxOpcode::*;
        let tag = post.tag();
        let input = post.in_param();
        let output = match opcode {
            op if op.base_address_table().is_some() => {
                let (table, command, level) = op.base_address_table().expect("checked");
                self.base_address_table_command(table, command, level, tag, input)?
            }
            ModifyQpc => {
                let (context, mask) = self.read_mailbox_pair::<Qpc>(input)?;
                self.modify_qp(tag, context, mask)?;
                Output::None
            }
            QueryQpc => Output::Bytes(self.query_qp(tag)?.bytes().to_vec()),
            CreateMpt => {
                let mpt = self.read_mailbox::<Mpt>(input, "IN_PARAM")?;
                self.create_mpt(tag, mpt)?;
                Output::None
            }
            DestroyMpt => {
                self.destroy_mpt(tag)?;
                Output::None
            }
            QueryMpt => Output::Bytes(self.query_mpt(tag)?.bytes().to_vec()),
            CreateCqc => {
                let cqc = self.read_mailbox::<Cqc>(input, "IN_PARAM")?;
                self.create_cq(tag, cqc)?;
                Output::None
            }
            ModifyCqc => {
                let (context, mask) = self.read_mailbox_pair::<Cqc>(input)?;
                self.modify_cq(tag, context, mask)?;
                Output::None
            }
            QueryCqc => Output::Bytes(self.query_cq(tag)?.bytes().to_vec()),
            DestroyCqc => {
                self.destroy_cq(tag)?;
                Output::None
            }
            CreateSrq => {
                let srqc = self.read_mailbox::<Srqc>(input, "IN_PARAM")?;
                self.create_srq(tag, srqc)?;
                Output::None
            }
            ModifySrqc => {
                let (context, mask) = self.read_mailbox_pair::<Srqc>(input)?;
                self.modify_srq(tag, context, mask)?;
                Output::None
            }
            QuerySrqc => Output::Bytes(self.query_srq(tag)?.bytes().to_vec()),
            DestroySrq => {
                self.destroy_srq(tag)?;
                Output::None
            }
            CreateAeqc | CreateCeqc => {
                let eqc = self.read_mailbox::<Eqc>(input, "IN_PARAM")?;
                self.create_eq(tag, eq_kind(opcode), eqc)?;
                Output::None
            }
            ModifyAeqc | ModifyCeqc => {
                let (context, mask) = self.read_mailbox_pair::<Eqc>(input)?;
                self.modify_eq(tag, eq_kind(opcode), context, mask)?;
                Output::None
            }
            QueryAeqc | QueryCeqc => Output::Bytes(self.query_eq(tag, eq_kind(opcode))?.bytes().to_vec()),
            DestroyAeqc | DestroyCeqc => {
                self.destroy_eq(tag, eq_kind(opcode))?;
                Output::None
            }
            _ => unreachable!("base-address-table opcodes handled above"),
        };
        if let Output::Bytes(bytes) = output {
            let address = post.out_param();
            self.dma_write(address, &bytes)
                .map_err(|e| Rejection::dma("OUT_PARAM", address, e))?;
        }
        Ok(())
    }

    fn base_address_table_command(
        &mut self,
        table: ContextTable,
        command: BtCommand,
        level: u8,
        index: u32,
        address: u64,
    ) -> Result<Output, Rejection> {
        let bus_master = self.bus.master();
        let memory = self.bus.gated_memory();
        let context_table = self.contexts.table_mut(table);
        match command {
            BtCommand::Write => {
                context_table
                    .write_base_address(index, level, address)
                    .map_err(|e| Rejection::parameter("IN_PARAM", address, e.to_string()))?;
                Ok(Output::None)
            }
            BtCommand::Destroy => {
                context_table
                    .destroy_base_address(index, level)
                    .map_err(|e| Rejection::parameter("TAG", index as u64, e.to_string()))?;
                Ok(Output::None)
            }
            BtCommand::Read => {
                if !bus_master && level > 0 {
                    return Err(Rejection::dma("BT", address, "bus mastering disabled"));
                }
                let found = context_table
                    .read_base_address(memory, index, level)
                    .map_err(|e| Rejection::no_table("TAG", index as u64, e))?;
                Ok(Output::Bytes(found.to_le_bytes().to_vec()))
            }
        }
    }

    /// FUNC_CLEAR: forget every context-table address, EQ and queued mailbox command.
    pub(crate) fn clear_function_resources(&mut self) {
        self.contexts.clear_tables(&self.config);
        self.eqs.clear();
        self.firmware.mailbox_queue.clear();
        self.firmware.attributes_configured = false;
    }
}

fn eq_kind(opcode: MailboxOpcode) -> EqKind {
    use MailboxOpcode::*;
    match opcode {
        CreateAeqc | ModifyAeqc | QueryAeqc | DestroyAeqc => EqKind::Async,
        _ => EqKind::Completion,
    }
}
