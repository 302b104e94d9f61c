//! Contracts shared by the three zerg binaries.
//!
//! - [`v1`] is the `zerg.v1` gRPC API: the `Control` service that `zergctl` calls and the
//!   `Worker` service that `zerg-worker-agent` calls. They are served on separate Unix sockets:
//!   the control socket (zergd's owner only) and one worker-plane socket per rush, where every
//!   call must carry the calling worker's token.
//! - [`graph`] is the task-graph file format (`.gsd/specs/<feature>/task-graph.json`) and its
//!   validation. It lives here, beside the wire format, because both `zergd` (which runs
//!   graphs) and `zergctl validate` (which checks them offline) need it, and neither binary
//!   may depend on the other.
//! - [`transport`] connects a client to a socket path and finds the default socket.
//! - [`contract`] is what zergd, its workers and the worker image agree on: the worker
//!   environment, exit codes, the worker token and lease revocations, the image layout.
//! - `testkit` (cargo feature `testkit`, for the tests of every crate) is what their tests
//!   share: git with an explicit identity, waiting for a condition, skipping with a reason.

pub mod contract;
pub mod graph;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod transport;
pub mod watch;

/// Generated code for the `zerg.v1` package.
#[expect(
    missing_docs,
    reason = "generated code carries the proto comments only where written"
)]
#[expect(
    clippy::large_enum_variant,
    reason = "generated oneof; lease replies are few and short-lived"
)]
pub mod v1 {
    tonic::include_proto!("zerg.v1");
}

/// The encoded `FileDescriptorSet` of `zerg.v1`, which zergd serves over gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/zerg_descriptor.bin"));

/// Environment variable that overrides the control socket path for every binary.
pub const ENV_SOCKET: &str = "ZERG_SOCKET";

/// The short lowercase names of the wire's enums, as zergctl prints them and the state file
/// writes them: `TaskState::InProgress` is `in_progress`, `WorkerState::GaveUp` is `gave_up`.
pub trait WireName: Sized {
    /// The name, without the enum's prefix; empty for an unspecified value.
    fn name(&self) -> String;
    /// The value with this name.
    fn from_name(name: &str) -> Option<Self>;
}

macro_rules! wire_names {
    ($($t:ty => $prefix:literal),+ $(,)?) => {
        $(
            impl WireName for $t {
                fn name(&self) -> String {
                    let full = self.as_str_name();
                    match full.strip_prefix($prefix) {
                        Some("UNSPECIFIED") | None => String::new(),
                        Some(n) => n.to_ascii_lowercase(),
                    }
                }

                fn from_name(name: &str) -> Option<Self> {
                    if name.is_empty() || name.eq_ignore_ascii_case("unspecified") {
                        return None;
                    }
                    Self::from_str_name(&format!("{}{}", $prefix, name.to_ascii_uppercase()))
                }
            }
        )+
    };
}

wire_names! {
    v1::LaunchMode => "LAUNCH_MODE_",
    v1::RushState => "RUSH_STATE_",
    v1::TaskState => "TASK_STATE_",
    v1::WorkerState => "WORKER_STATE_",
    v1::LevelState => "LEVEL_STATE_",
    v1::MergeState => "MERGE_STATE_",
    v1::Step => "STEP_",
    v1::FailKind => "FAIL_KIND_",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_the_short_lowercase_ones() {
        assert_eq!(v1::TaskState::InProgress.name(), "in_progress");
        assert_eq!(v1::WorkerState::GaveUp.name(), "gave_up");
        assert_eq!(v1::Step::VerifyingTier2.name(), "verifying_tier2");
        assert_eq!(v1::RushState::Unspecified.name(), "");
        assert_eq!(
            v1::LaunchMode::from_name("container"),
            Some(v1::LaunchMode::Container)
        );
        assert_eq!(v1::LaunchMode::from_name("vm"), None);
        assert_eq!(v1::RushState::from_name("unspecified"), None);
    }
}
