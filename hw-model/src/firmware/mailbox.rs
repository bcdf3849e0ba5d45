//! Mailbox execution: decode a posted mailbox command, move its context between the
//! mailbox buffer and the object engines, and report completion.

use rnic_firmware_if::bits::Layout;
use rnic_firmware_if::context::{Cqc, Eqc, Mpt, Qpc, Srqc};
use rnic_firmware_if::mailbox::{MailboxCompletion, MailboxOpcode, PostMailbox};

use super::{Firmware, Io, ObjectCommand, Rejection, Timer};
use crate::diagnostics::Source;
use crate::eq::EqKind;
use crate::time::Picoseconds;

/// What a mailbox asks for, once read.
enum Decoded {
    /// A command on an object, for the top to route.
    Object(ObjectCommand),
    /// A command executed already, with its answer for the out-parameter buffer.
    Done(Option<Vec<u8>>),
}

impl Firmware {
    /// The mailbox command at the head of the queue is due: it is read and, when it is a
    /// command on an object (a QP, CQ, SRQ, MPT or EQ), handed back for the top to
    /// execute and then to [`finish_mailbox`](Self::finish_mailbox); anything else (a
    /// base-address-table command, an unknown opcode, an unreadable mailbox) completes
    /// here.
    pub(crate) fn start_mailbox(&mut self, io: &mut impl Io) -> Option<(PostMailbox, MailboxOpcode, ObjectCommand)> {
        io.forget_caches();
        let post = self.mailbox_queue.pop_front()?;
        let Some(opcode) = MailboxOpcode::from_raw(post.command()) else {
            let unknown = Rejection {
                status: MailboxCompletion::UnknownCommand,
                field: "CMD",
                value: post.command() as u64,
                expected: "a mailbox opcode listed in docs/register-map.md".into(),
            };
            self.complete(io, &post, None, Err(unknown));
            return None;
        };
        match self.decode_mailbox(io, opcode, &post) {
            Ok(Decoded::Object(command)) => Some((post, opcode, command)),
            Ok(Decoded::Done(output)) => {
                let result = self.write_output(io, &post, output);
                self.complete(io, &post, Some(opcode), result);
                None
            }
            Err(rejection) => {
                self.complete(io, &post, Some(opcode), Err(rejection));
                None
            }
        }
    }

    /// The object command of mailbox `post` was executed with `result` (a query's answer
    /// or a rejection): the answer goes to the out-parameter buffer and the mailbox
    /// completes.
    pub(crate) fn finish_mailbox(
        &mut self,
        io: &mut impl Io,
        post: PostMailbox,
        opcode: MailboxOpcode,
        result: Result<Option<Vec<u8>>, Rejection>,
    ) {
        let result = result.and_then(|output| self.write_output(io, &post, output));
        self.complete(io, &post, Some(opcode), result);
    }

    /// Completes mailbox `post`: status, diagnostic, counter, event, the next mailbox.
    fn complete(
        &mut self,
        io: &mut impl Io,
        post: &PostMailbox,
        opcode: Option<MailboxOpcode>,
        result: Result<(), Rejection>,
    ) {
        let tag = post.tag();
        // The command's context changes reach host memory before it completes.
        io.write_back_contexts();
        let status = match result {
            Ok(()) => MailboxCompletion::Success,
            Err(rejection) => {
                let object = match opcode {
                    Some(op) => format!("mailbox {op:?} tag {tag:#x}"),
                    None => format!("mailbox command {:#x} tag {tag:#x}", post.command()),
                };
                io.diagnose(
                    Source::Mailbox,
                    object,
                    rejection.field,
                    rejection.value,
                    rejection.expected,
                );
                rejection.status
            }
        };
        self.last_mailbox_status = status;
        self.counters.mailbox_commands += 1;
        if post.event_enable() {
            io.mailbox_event(post.token(), status as u8, post.out_param());
        }
        if !self.mailbox_queue.is_empty() {
            let delay = Picoseconds(self.identity.mailbox_ps);
            io.schedule_in(delay, Timer::MailboxComplete);
        }
    }

    fn read_mailbox<L: Layout>(&mut self, io: &mut impl Io, address: u64, field: &'static str) -> Result<L, Rejection> {
        let mut value = L::zeroed();
        io.dma_read(address, value.bytes_mut())
            .map_err(|e| Rejection::dma(field, address, e))?;
        Ok(value)
    }

    fn read_mailbox_pair<L: Layout>(&mut self, io: &mut impl Io, address: u64) -> Result<(L, L), Rejection> {
        let context = self.read_mailbox::<L>(io, address, "IN_PARAM")?;
        let mask = self.read_mailbox::<L>(io, address.wrapping_add(L::SIZE as u64), "IN_PARAM")?;
        Ok((context, mask))
    }

    /// Reads mailbox `post`'s input: the object command it carries, or the answer of a
    /// base-address-table command, which the context block executes at once.
    fn decode_mailbox(
        &mut self,
        io: &mut impl Io,
        opcode: MailboxOpcode,
        post: &PostMailbox,
    ) -> Result<Decoded, Rejection> {
        use MailboxOpcode::*;
        let tag = post.tag();
        let input = post.in_param();
        let command = match opcode {
            op if op.base_address_table().is_some() => {
                let (table, command, level) = op.base_address_table().expect("checked");
                let found = io.base_address_table(table, command, level, tag, input)?;
                return Ok(Decoded::Done(found.map(|address| address.to_le_bytes().to_vec())));
            }
            ModifyQpc => {
                let (context, mask) = self.read_mailbox_pair::<Qpc>(io, input)?;
                ObjectCommand::ModifyQp {
                    qpn: tag,
                    context: Box::new(context),
                    mask: Box::new(mask),
                }
            }
            QueryQpc => ObjectCommand::QueryQp { qpn: tag },
            CreateMpt => ObjectCommand::CreateMpt {
                index: tag,
                mpt: self.read_mailbox::<Mpt>(io, input, "IN_PARAM")?,
            },
            DestroyMpt => ObjectCommand::DestroyMpt { index: tag },
            QueryMpt => ObjectCommand::QueryMpt { index: tag },
            CreateCqc => ObjectCommand::CreateCq {
                cqn: tag,
                cqc: self.read_mailbox::<Cqc>(io, input, "IN_PARAM")?,
            },
            ModifyCqc => {
                let (context, mask) = self.read_mailbox_pair::<Cqc>(io, input)?;
                ObjectCommand::ModifyCq {
                    cqn: tag,
                    context,
                    mask,
                }
            }
            QueryCqc => ObjectCommand::QueryCq { cqn: tag },
            DestroyCqc => ObjectCommand::DestroyCq { cqn: tag },
            CreateSrq => ObjectCommand::CreateSrq {
                srqn: tag,
                srqc: self.read_mailbox::<Srqc>(io, input, "IN_PARAM")?,
            },
            ModifySrqc => {
                let (context, mask) = self.read_mailbox_pair::<Srqc>(io, input)?;
                ObjectCommand::ModifySrq {
                    srqn: tag,
                    context,
                    mask,
                }
            }
            QuerySrqc => ObjectCommand::QuerySrq { srqn: tag },
            DestroySrq => ObjectCommand::DestroySrq { srqn: tag },
            CreateAeqc | CreateCeqc => ObjectCommand::CreateEq {
                eqn: tag,
                kind: eq_kind(opcode),
                eqc: self.read_mailbox::<Eqc>(io, input, "IN_PARAM")?,
            },
            ModifyAeqc | ModifyCeqc => {
                let (context, mask) = self.read_mailbox_pair::<Eqc>(io, input)?;
                ObjectCommand::ModifyEq {
                    eqn: tag,
                    kind: eq_kind(opcode),
                    context,
                    mask,
                }
            }
            QueryAeqc | QueryCeqc => ObjectCommand::QueryEq {
                eqn: tag,
                kind: eq_kind(opcode),
            },
            DestroyAeqc | DestroyCeqc => ObjectCommand::DestroyEq {
                eqn: tag,
                kind: eq_kind(opcode),
            },
            _ => unreachable!("base-address-table opcodes handled above"),
        };
        Ok(Decoded::Object(command))
    }

    /// Writes a command's answer (if any) to the out-parameter buffer.
    fn write_output(&mut self, io: &mut impl Io, post: &PostMailbox, output: Option<Vec<u8>>) -> Result<(), Rejection> {
        if let Some(bytes) = output {
            let address = post.out_param();
            io.dma_write(address, &bytes)
                .map_err(|e| Rejection::dma("OUT_PARAM", address, e))?;
        }
        Ok(())
    }

    /// FUNC_CLEAR: forget every context-table address, EQ and queued mailbox command.
    pub(crate) fn clear_function_resources(&mut self, io: &mut impl Io) {
        io.clear_function();
        self.mailbox_queue.clear();
        self.attributes_configured = false;
    }
}

fn eq_kind(opcode: MailboxOpcode) -> EqKind {
    use MailboxOpcode::*;
    match opcode {
        CreateAeqc | ModifyAeqc | QueryAeqc | DestroyAeqc => EqKind::Async,
        _ => EqKind::Completion,
    }
}
