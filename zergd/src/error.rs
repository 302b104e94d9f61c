//! The supervisor's error type: what a command or a worker call can be refused with, and why.
//! The gRPC layer turns it into a `tonic::Status` at the edge ([`From`]), so nothing inside the
//! supervisor depends on the wire.

use tonic::{Code, Status};
use zerg_proto::contract::Revocation;

/// Why the supervisor refused a command or a worker call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SupervisorError {
    /// The rush, task, worker slot or file does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A field of the request is wrong (the message names it).
    #[error("{0}")]
    InvalidArgument(String),
    /// The request does not fit the current state (a rush that is not running, a lease that
    /// ended).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A rush of that feature already exists or is being prepared.
    #[error("{0}")]
    AlreadyExists(String),
    /// The caller is not allowed to do this (another worker's token, another rush's socket).
    #[error("{0}")]
    PermissionDenied(String),
    /// The call carries no worker token.
    #[error("{0}")]
    Unauthenticated(String),
    /// The supervisor is not running.
    #[error("{0}")]
    Unavailable(String),
    /// Something failed inside zergd (git, the filesystem).
    #[error("{0}")]
    Internal(String),
    /// The worker's lease or the worker itself is over: it must stop what it is doing.
    #[error("{error}")]
    Revoked {
        /// What ended.
        revocation: Revocation,
        /// The refusal itself.
        error: Box<SupervisorError>,
    },
}

macro_rules! constructors {
    ($($fn_name:ident => $variant:ident),+ $(,)?) => {
        impl SupervisorError {
            $(
                #[doc = concat!("A [`SupervisorError::", stringify!($variant), "`].")]
                pub fn $fn_name(message: impl Into<String>) -> Self {
                    SupervisorError::$variant(message.into())
                }
            )+
        }
    };
}

constructors! {
    not_found => NotFound,
    invalid_argument => InvalidArgument,
    failed_precondition => FailedPrecondition,
    already_exists => AlreadyExists,
    permission_denied => PermissionDenied,
    unauthenticated => Unauthenticated,
    unavailable => Unavailable,
    internal => Internal,
}

impl SupervisorError {
    /// Marks a refusal as the end of a lease or of a worker generation.
    pub fn revoked(revocation: Revocation, error: SupervisorError) -> Self {
        SupervisorError::Revoked {
            revocation,
            error: Box::new(error),
        }
    }

    /// The gRPC code this refusal is sent with.
    pub fn code(&self) -> Code {
        match self {
            SupervisorError::NotFound(_) => Code::NotFound,
            SupervisorError::InvalidArgument(_) => Code::InvalidArgument,
            SupervisorError::FailedPrecondition(_) => Code::FailedPrecondition,
            SupervisorError::AlreadyExists(_) => Code::AlreadyExists,
            SupervisorError::PermissionDenied(_) => Code::PermissionDenied,
            SupervisorError::Unauthenticated(_) => Code::Unauthenticated,
            SupervisorError::Unavailable(_) => Code::Unavailable,
            SupervisorError::Internal(_) => Code::Internal,
            SupervisorError::Revoked { error, .. } => error.code(),
        }
    }

    /// The message, without the code.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl From<SupervisorError> for Status {
    fn from(e: SupervisorError) -> Status {
        match e {
            SupervisorError::Revoked { revocation, error } => revocation.mark(Status::from(*error)),
            other => Status::new(other.code(), other.to_string()),
        }
    }
}

/// An error and every cause under it, as one line: `op path: cause: cause`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_revocations_reach_the_wire() {
        let s = Status::from(SupervisorError::not_found("no rush x"));
        assert_eq!((s.code(), s.message()), (Code::NotFound, "no rush x"));
        let e = SupervisorError::revoked(
            Revocation::Lease("T#1".into()),
            SupervisorError::failed_precondition("lease T#1 is no longer valid"),
        );
        assert_eq!(e.code(), Code::FailedPrecondition);
        let s = Status::from(e);
        assert_eq!(
            Revocation::of_status(&s),
            Some(Revocation::Lease("T#1".into()))
        );
        assert_eq!(s.message(), "lease T#1 is no longer valid");
    }
}
