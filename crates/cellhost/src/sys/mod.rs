//! Operating-system helpers every module may use, depending on no other
//! module of this crate: pipes, fd placement and signals (`unix.rs`),
//! process checks from /proc (`unix.rs`), owner-only directories
//! (`fs.rs`), random ids (`random.rs`), private Unix sockets and
//! abort-on-drop tasks (`socket.rs`), loop-mounted images (`mount.rs`) and the death-pipe watcher that
//! kills a process group when the host dies (`death.rs`).

mod death;
mod fs;
pub(crate) mod mount;
mod random;
mod socket;
mod unix;

pub use death::watch_group;
pub(crate) use fs::private_dir;
pub use mount::private_mount_namespace;
pub(crate) use random::random_hex;
pub(crate) use socket::{bind_private_socket, AbortOnDrop};
pub(crate) use unix::{
    child_setup, live_start_time, pidfd_open, pidfd_signal, pipe, raw, signal_group, signal_name,
    signal_pid,
};
pub use unix::{
    children, descendants, parent_pid, pid_alive, process_group, process_start_time, rss_bytes,
};
