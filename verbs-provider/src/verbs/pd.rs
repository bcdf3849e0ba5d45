//! Protection domains (`ibv_pd`): a software object — a PD number that MPTs, QPs and
//! SRQs carry, so the device can check that a key and a queue belong together.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::context::{Context, ContextInner};
use super::error::{DestroyError, Result, VerbsError};

pub(crate) struct PdInner {
    pub(crate) context: Arc<ContextInner>,
    pub(crate) pdn: u32,
    released: AtomicBool,
}

impl PdInner {
    fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.context.lock().allocators.pds.free(self.pdn);
            tracing::debug!(pdn = self.pdn, "PD deallocated");
        }
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        self.release();
    }
}

/// A protection domain. Memory regions, QPs, SRQs and address handles created from it
/// keep it alive.
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("pdn", &self.inner.pdn)
            .finish()
    }
}

impl Context {
    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    /// [`VerbsError::OutOfResources`] when every PD number is taken.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pdn = self
            .inner
            .lock()
            .allocators
            .pds
            .allocate()
            .ok_or_else(|| VerbsError::OutOfResources("no free PD number".into()))?;
        tracing::debug!(pdn, "PD allocated");
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                context: self.inner.clone(),
                pdn,
                released: AtomicBool::new(false),
            }),
        })
    }
}

impl ProtectionDomain {
    /// The PD number (`handle`).
    pub fn pd_number(&self) -> u32 {
        self.inner.pdn
    }

    /// The context it belongs to.
    pub fn context(&self) -> Context {
        Context {
            inner: self.inner.context.clone(),
        }
    }

    /// `ibv_dealloc_pd`.
    ///
    /// # Errors
    /// [`VerbsError::Busy`] (the PD handed back) while MRs, QPs, SRQs or AHs use it.
    pub fn dealloc(self) -> Result<(), DestroyError<Self>> {
        if Arc::strong_count(&self.inner) > 1 {
            let users = Arc::strong_count(&self.inner) - 1;
            let pdn = self.inner.pdn;
            return Err(DestroyError::busy(self, format!("PD {pdn} is used by {users} objects")));
        }
        self.inner.release();
        Ok(())
    }
}
