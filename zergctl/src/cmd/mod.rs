//! One module per zergctl command that talks to zergd (`validate` and `symbols` work
//! offline).

pub mod dashboard;
pub mod design;
pub mod init;
pub mod land;
pub mod list;
pub mod logs;
pub mod prune;
pub mod retry;
pub mod rush;
pub mod status;
pub mod stop;
pub mod symbols;
pub mod validate;
