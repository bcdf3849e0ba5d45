//! An in-process connection manager: QPs of NICs in one process (embedded NICs on one
//! fabric, or any devices one process drives) are connected directly, the way
//! `rnic-bench` and the demo connect theirs, and the private data travels through
//! shared memory instead of CM MADs on QP1.
//!
//! It keeps the CM's contract — a listener per address, requests carrying private data,
//! accept or reject with private data, disconnect seen by the peer — so protocol code
//! tested over it runs unchanged over the RDMA CM. What it cannot give is the CM's
//! frames on the wire: captures of a session set up here carry no REQ/REP, so Wireshark
//! cannot tell which QPs carry NVMe-oF.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use rnic_verbs::{Context, QpAttributeMask, QpAttributes, QpState, QueuePair, RcConnection};

use super::connection::{
    rc_connection, AcceptParams, ConnectParams, ConnectResult, Connection, ConnectionError, Connector, End,
    Established, IncomingRequest, Listener, PendingConnect, RcPathConfig, ServiceAddress,
};

/// Most private data a CM REQ carries for a consumer behind RDMA-CM's IP header.
pub const MAX_REQUEST_PRIVATE_DATA: usize = 56;
/// Most private data a CM REP carries.
pub const MAX_REPLY_PRIVATE_DATA: usize = 196;
/// Most private data a CM REJ carries.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
enum Answer {
    Pending,
    Accepted {
        end: End,
        private_data: Vec<u8>,
        responder_resources: u8,
        initiator_depth: u8,
    },
    Rejected(Vec<u8>),
}

#[derive(Debug)]
struct Exchange {
    requester: End,
    params: ConnectParams,
    answer: Answer,
    /// Disconnected by the active (0) and passive (1) end.
    disconnected: [bool; 2],
}

type RequestQueue = Arc<Mutex<VecDeque<Arc<Mutex<Exchange>>>>>;

#[derive(Default)]
struct Registry {
    listeners: HashMap<ServiceAddress, RequestQueue>,
    next_psn: u32,
}

/// The in-process connection manager. Clones share it: give one to the target's
/// listener and one to the host's connector.
#[derive(Clone)]
pub struct DirectCm {
    registry: Arc<Mutex<Registry>>,
    config: RcPathConfig,
}

impl std::fmt::Debug for DirectCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectCm")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for DirectCm {
    fn default() -> Self {
        Self::new(RcPathConfig::default())
    }
}

impl DirectCm {
    /// A connection manager with no listeners.
    pub fn new(config: RcPathConfig) -> Self {
        Self {
            registry: Arc::new(Mutex::new(Registry {
                next_psn: 0x10_0000,
                ..Registry::default()
            })),
            config,
        }
    }

    /// Listens on `address`.
    ///
    /// # Errors
    /// [`ConnectionError::AddressInUse`] if another listener has it.
    pub fn listen(&self, address: ServiceAddress) -> Result<DirectListener, ConnectionError> {
        let mut registry = lock(&self.registry);
        if registry.listeners.contains_key(&address) {
            return Err(ConnectionError::AddressInUse(address));
        }
        let queue: RequestQueue = Arc::default();
        registry.listeners.insert(address, queue.clone());
        Ok(DirectListener {
            cm: self.clone(),
            address,
            queue,
        })
    }

    /// A connector for the active side.
    pub fn connector(&self) -> DirectConnector {
        DirectConnector { cm: self.clone() }
    }

    fn next_psn(&self) -> u32 {
        let mut registry = lock(&self.registry);
        registry.next_psn = registry.next_psn.wrapping_mul(1_103_515_245).wrapping_add(12_345) & 0xFF_FFFF;
        registry.next_psn
    }
}

/// The active side of a [`DirectCm`].
pub struct DirectConnector {
    cm: DirectCm,
}

impl Connector for DirectConnector {
    fn connect(
        &mut self,
        context: &Context,
        qp: &QueuePair,
        params: &ConnectParams,
    ) -> Result<Box<dyn PendingConnect>, ConnectionError> {
        if params.private_data.len() > MAX_REQUEST_PRIVATE_DATA {
            return Err(ConnectionError::Invalid(format!(
                "{} bytes of REQ private data, at most {MAX_REQUEST_PRIVATE_DATA}",
                params.private_data.len()
            )));
        }
        let queue = lock(&self.cm.registry)
            .listeners
            .get(&params.destination)
            .cloned()
            .ok_or(ConnectionError::Unreachable(params.destination))?;
        qp.init_rc().map_err(|e| ConnectionError::Verbs(e.to_string()))?;
        let requester = End::of(context, qp, self.cm.next_psn())?;
        let exchange = Arc::new(Mutex::new(Exchange {
            requester,
            params: params.clone(),
            answer: Answer::Pending,
            disconnected: [false; 2],
        }));
        lock(&queue).push_back(exchange.clone());
        Ok(Box::new(DirectPending {
            cm: self.cm.clone(),
            exchange: Some(exchange),
        }))
    }
}

struct DirectPending {
    cm: DirectCm,
    exchange: Option<Arc<Mutex<Exchange>>>,
}

impl PendingConnect for DirectPending {
    fn poll(&mut self, qp: &QueuePair) -> Option<ConnectResult> {
        let exchange = self.exchange.as_ref()?;
        let state = lock(exchange);
        let result = match &state.answer {
            Answer::Pending => return None,
            Answer::Rejected(private_data) => Err(ConnectionError::Rejected {
                private_data: private_data.clone(),
            }),
            Answer::Accepted {
                end,
                private_data,
                responder_resources,
                initiator_depth,
            } => {
                let connection = rc_connection(
                    &self.cm.config,
                    end,
                    state.requester.psn,
                    state.params.responder_resources,
                    state.params.initiator_depth,
                    state.params.rnr_retry_count,
                );
                match qp.rtr_rts_rc(&RcConnection {
                    retry_cnt: state.params.retry_count,
                    ..connection
                }) {
                    Ok(()) => Ok((
                        Established {
                            private_data: private_data.clone(),
                            responder_resources: *responder_resources,
                            initiator_depth: *initiator_depth,
                        },
                        Box::new(DirectConnection {
                            exchange: exchange.clone(),
                            end: 0,
                        }) as Box<dyn Connection>,
                    )),
                    Err(e) => Err(ConnectionError::Verbs(e.to_string())),
                }
            }
        };
        drop(state);
        self.exchange = None;
        Some(result)
    }
}

/// The passive side of a [`DirectCm`] on one address. Dropping it stops listening and
/// rejects the requests still waiting.
pub struct DirectListener {
    cm: DirectCm,
    address: ServiceAddress,
    queue: RequestQueue,
}

impl Drop for DirectListener {
    fn drop(&mut self) {
        lock(&self.cm.registry).listeners.remove(&self.address);
        for exchange in lock(&self.queue).drain(..) {
            lock(&exchange).answer = Answer::Rejected(Vec::new());
        }
    }
}

impl Listener for DirectListener {
    fn address(&self) -> ServiceAddress {
        self.address
    }

    fn poll_request(&mut self) -> Option<Box<dyn IncomingRequest>> {
        let exchange = lock(&self.queue).pop_front()?;
        let (private_data, responder_resources, initiator_depth, peer) = {
            let state = lock(&exchange);
            (
                state.params.private_data.clone(),
                state.params.responder_resources,
                state.params.initiator_depth,
                format!("{} QP {}", state.requester.gid, state.requester.qpn),
            )
        };
        Some(Box::new(DirectRequest {
            cm: self.cm.clone(),
            exchange,
            private_data,
            responder_resources,
            initiator_depth,
            peer,
        }))
    }
}

struct DirectRequest {
    cm: DirectCm,
    exchange: Arc<Mutex<Exchange>>,
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    peer: String,
}

impl IncomingRequest for DirectRequest {
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn responder_resources(&self) -> u8 {
        self.responder_resources
    }

    fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn accept(
        self: Box<Self>,
        context: &Context,
        qp: &QueuePair,
        params: &AcceptParams,
    ) -> Result<Box<dyn Connection>, ConnectionError> {
        let mut state = lock(&self.exchange);
        if params.private_data.len() > MAX_REPLY_PRIVATE_DATA {
            state.answer = Answer::Rejected(Vec::new());
            return Err(ConnectionError::Invalid(format!(
                "{} bytes of REP private data, at most {MAX_REPLY_PRIVATE_DATA}",
                params.private_data.len()
            )));
        }
        let own = match End::of(context, qp, self.cm.next_psn()) {
            Ok(own) => own,
            Err(e) => {
                state.answer = Answer::Rejected(Vec::new());
                return Err(e);
            }
        };
        let connection = rc_connection(
            &self.cm.config,
            &state.requester,
            own.psn,
            params.responder_resources,
            params.initiator_depth,
            params.rnr_retry_count,
        );
        if let Err(e) = qp.connect_rc(&connection) {
            state.answer = Answer::Rejected(Vec::new());
            return Err(ConnectionError::Verbs(e.to_string()));
        }
        state.answer = Answer::Accepted {
            end: own,
            private_data: params.private_data.clone(),
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
        };
        drop(state);
        Ok(Box::new(DirectConnection {
            exchange: self.exchange,
            end: 1,
        }))
    }

    fn reject(self: Box<Self>, private_data: &[u8]) {
        let kept = &private_data[..private_data.len().min(MAX_REJECT_PRIVATE_DATA)];
        lock(&self.exchange).answer = Answer::Rejected(kept.to_vec());
    }
}

struct DirectConnection {
    exchange: Arc<Mutex<Exchange>>,
    end: usize,
}

impl Connection for DirectConnection {
    fn is_disconnected(&mut self) -> bool {
        lock(&self.exchange).disconnected[1 - self.end]
    }

    fn disconnect(&mut self, qp: &QueuePair) {
        lock(&self.exchange).disconnected[self.end] = true;
        let _ = qp.modify(
            &QpAttributes {
                qp_state: QpState::Err,
                ..QpAttributes::default()
            },
            QpAttributeMask::STATE,
        );
    }
}

impl Drop for DirectConnection {
    fn drop(&mut self) {
        // A connection dropped without a disconnect still ends: the peer sees it.
        lock(&self.exchange).disconnected[self.end] = true;
    }
}
