//! Contracts shared by the three zerg binaries.
//!
//! - [`v1`] is the `zerg.v1` gRPC API: the `Control` service that `zergctl` calls and the
//!   `Worker` service that `zerg-worker-agent` calls. Both are served by `zergd` on one Unix
//!   socket.
//! - [`graph`] is the task-graph file format (`.gsd/specs/<feature>/task-graph.json`) and its
//!   validation. It lives here, beside the wire format, because both `zergd` (which runs
//!   graphs) and `zergctl validate` (which checks them offline) need it, and neither binary
//!   may depend on the other.
//! - [`transport`] connects a client to a socket path and finds the default socket.

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
