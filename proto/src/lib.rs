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

pub mod contract;
pub mod graph;
pub mod transport;

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

/// Environment variable that overrides the control socket path for every binary.
pub const ENV_SOCKET: &str = "ZERG_SOCKET";
