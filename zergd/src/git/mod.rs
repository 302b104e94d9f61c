//! Git for zergd: everything goes through `zerg-git` (in process on gix, or the `git` program
//! for worktrees, checkouts and the fallbacks), including the import of a container worker's
//! objects ([`objects`]).

pub use zerg_git::cli::*;
pub use zerg_git::objects;
