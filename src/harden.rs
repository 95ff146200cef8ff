//! Hardening of the serving process (the production profile of `inferno serve`).
//!
//! - [`deny_dumps_and_ptrace`]: no core dumps (`RLIMIT_CORE` 0), not dumpable (`PR_SET_DUMPABLE`
//!   0: no ptrace attach and no `/proc/PID/mem` for other users, no core file either), and
//!   `no_new_privs` (nothing exec'd can gain privileges). Called before any thread or secret
//!   exists, so every thread inherits it.
//! - [`lock_resident_memory`]: `mlockall(MCL_CURRENT | MCL_ONFAULT)` once the keys exist (TLS
//!   key, audit signing key, content key): the pages that hold them are never swapped out. Model
//!   weights mapped later are not locked.
//! - [`drop_privileges`]: switches every thread to an unprivileged user and its groups after the
//!   server opened what needs privileges, and checks that the switch cannot be undone.
//!
//! Each step fails closed: the caller refuses to serve when one fails.

use std::ffi::CString;
use std::io;

use nix::unistd::{Gid, Uid, User};
use rustix::mm::{MlockAllFlags, mlockall};
use rustix::process::{DumpableBehavior, Resource, Rlimit, set_dumpable_behavior, setrlimit};

/// A hardening step that failed; the server does not serve.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// `setrlimit(RLIMIT_CORE, 0)` failed.
    #[error("cannot disable core dumps (RLIMIT_CORE): {0}")]
    CoreLimit(#[source] io::Error),
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error("cannot make the process non-dumpable (PR_SET_DUMPABLE): {0}")]
    Dumpable(#[source] io::Error),
    /// `prctl(PR_SET_NO_NEW_PRIVS, 1)` failed.
    #[error("cannot set no_new_privs (PR_SET_NO_NEW_PRIVS): {0}")]
    NoNewPrivs(#[source] io::Error),
    /// `mlockall` failed, usually because `RLIMIT_MEMLOCK` is too small.
    #[error(
        "cannot lock the process's memory (mlockall): {0}; raise RLIMIT_MEMLOCK (systemd: LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK"
    )]
    LockMemory(#[source] io::Error),
    /// The user to drop to does not exist.
    #[error("no user named {0:?}")]
    UnknownUser(String),
    /// The user database could not be read.
    #[error("cannot look up user {name:?}: {source}")]
    UserLookup {
        /// The user's name.
        name: String,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// A set*id call failed (not running as root, or without CAP_SETUID/CAP_SETGID).
    #[error("cannot switch to user {name:?} ({step}): {source}")]
    Switch {
        /// The user's name.
        name: String,
        /// The call that failed.
        step: &'static str,
        /// Why.
        #[source]
        source: nix::Error,
    },
    /// After the switch, the process could still regain root.
    #[error("dropped to user {0:?} but could regain root: refusing to continue")]
    Regained(String),
}

/// Disables core dumps and ptrace attach, and sets `no_new_privs` on the calling thread (and so on
/// every thread and process it starts afterwards).
pub fn deny_dumps_and_ptrace() -> Result<(), HardenError> {
    setrlimit(
        Resource::Core,
        Rlimit {
            current: Some(0),
            maximum: Some(0),
        },
    )
    .map_err(|err| HardenError::CoreLimit(err.into()))?;
    set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|err| HardenError::Dumpable(err.into()))?;
    rustix::thread::set_no_new_privs(true).map_err(|err| HardenError::NoNewPrivs(err.into()))?;
    Ok(())
}

/// Locks every page mapped now into memory as it is touched (`MCL_CURRENT | MCL_ONFAULT`), so
/// that the keys created before this call are never written to swap. Mappings created later
/// (model weights, KV cache) are not locked.
pub fn lock_resident_memory() -> Result<(), HardenError> {
    mlockall(MlockAllFlags::CURRENT | MlockAllFlags::ONFAULT)
        .map_err(|err| HardenError::LockMemory(err.into()))
}

/// Switches the whole process (every thread: glibc's `setuid` applies to all of them) to `name`,
/// its primary group and its supplementary groups, checks that root cannot be regained, and
/// makes the process non-dumpable again (a credential change resets that flag).
pub fn drop_privileges(name: &str) -> Result<(), HardenError> {
    let user = User::from_name(name)
        .map_err(|source| HardenError::UserLookup {
            name: name.to_owned(),
            source,
        })?
        .ok_or_else(|| HardenError::UnknownUser(name.to_owned()))?;
    let switch = |step: &'static str| {
        move |source| HardenError::Switch {
            name: name.to_owned(),
            step,
            source,
        }
    };
    let c_name = CString::new(name).map_err(|_| HardenError::UnknownUser(name.to_owned()))?;
    nix::unistd::initgroups(&c_name, user.gid).map_err(switch("initgroups"))?;
    nix::unistd::setgid(user.gid).map_err(switch("setgid"))?;
    nix::unistd::setuid(user.uid).map_err(switch("setuid"))?;
    if !user.uid.is_root()
        && (nix::unistd::setuid(Uid::from_raw(0)).is_ok()
            || nix::unistd::setgid(Gid::from_raw(0)).is_ok())
    {
        return Err(HardenError::Regained(name.to_owned()));
    }
    set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|err| HardenError::Dumpable(err.into()))?;
    Ok(())
}
