//! Attachments: owners whose kernels are never reaped while a guard
//! lives.

use std::sync::Arc;

use super::{KernelManager, Shared};

impl KernelManager {
    /// Keep `owner`'s kernels from being reaped while the guard lives (a
    /// front end streaming them, a user attached from the dashboard).
    pub fn attach(&self, owner: &str) -> Attachment {
        *self
            .shared
            .state()
            .attached
            .entry(owner.to_owned())
            .or_default() += 1;
        Attachment {
            shared: self.shared.clone(),
            owner: owner.to_owned(),
        }
    }
}

/// Keeps an owner's kernels from idle reaping while alive.
#[derive(Debug)]
pub struct Attachment {
    shared: Arc<Shared>,
    owner: String,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let mut state = self.shared.state();
        if let Some(n) = state.attached.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                state.attached.remove(&self.owner);
            }
        }
    }
}
