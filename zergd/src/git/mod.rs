//! Git for zergd: everything goes through `zerg-git` (in process on gix, or the `git` program
//! for worktrees, checkouts and the fallbacks), including the import of a container worker's
//! objects ([`objects`]).

pub use zerg_git::cli::*;
pub use zerg_git::objects;

/// The size limits on a worker's git objects that the rush's `container:` settings give.
pub fn import_limits(c: &crate::config::ContainerConfig) -> objects::ImportLimits {
    objects::ImportLimits {
        max_object: c.max_object_size.0 as u64,
        max_pack: c.max_pack_size.0 as u64,
    }
}
