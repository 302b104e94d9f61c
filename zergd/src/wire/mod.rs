//! Conversions between the supervisor's domain types ([`crate::domain`]) and the wire's
//! (`zerg_proto::v1`), in one place: requests are checked and bounded here
//! ([`worker`], [`control`]) and replies built here ([`status`]), so the supervisor never
//! handles a wire message.

pub mod control;
pub mod status;
pub mod worker;

use zerg_proto::WireName;
use zerg_proto::v1;

use crate::domain::{FailKind, Mode, Step};

/// The wire value of a domain state (the two share their names), as the `i32` prost stores.
pub fn state<E: WireName + Into<i32>>(v: impl std::fmt::Display) -> i32 {
    E::from_name(&v.to_string()).map(Into::into).unwrap_or(0)
}

/// The launch mode a request asks for; `Ok(None)` when it names none, `Err` for an unknown
/// value.
pub fn mode_from_wire(raw: i32) -> Result<Option<Mode>, i32> {
    match v1::LaunchMode::try_from(raw) {
        Ok(v1::LaunchMode::Unspecified) => Ok(None),
        Ok(v1::LaunchMode::Subprocess) => Ok(Some(Mode::Subprocess)),
        Ok(v1::LaunchMode::Container) => Ok(Some(Mode::Container)),
        Ok(v1::LaunchMode::Swarm) => Ok(Some(Mode::Swarm)),
        Ok(v1::LaunchMode::Kubernetes) => Ok(Some(Mode::Kubernetes)),
        Err(_) => Err(raw),
    }
}

/// The domain step of a wire step; `None` for an unspecified or unknown value.
pub fn step_from_wire(raw: i32) -> Option<Step> {
    Some(match v1::Step::try_from(raw).ok()? {
        v1::Step::Unspecified => return None,
        v1::Step::Initializing => Step::Initializing,
        v1::Step::LoadingContext => Step::LoadingContext,
        v1::Step::Implementing => Step::Implementing,
        v1::Step::VerifyingTier1 => Step::VerifyingTier1,
        v1::Step::VerifyingTier2 => Step::VerifyingTier2,
        v1::Step::VerifyingTier3 => Step::VerifyingTier3,
        v1::Step::Committing => Step::Committing,
        v1::Step::Idle => Step::Idle,
    })
}

/// The wire step of a domain step.
pub fn step_to_wire(s: Step) -> v1::Step {
    match s {
        Step::Initializing => v1::Step::Initializing,
        Step::LoadingContext => v1::Step::LoadingContext,
        Step::Implementing => v1::Step::Implementing,
        Step::VerifyingTier1 => v1::Step::VerifyingTier1,
        Step::VerifyingTier2 => v1::Step::VerifyingTier2,
        Step::VerifyingTier3 => v1::Step::VerifyingTier3,
        Step::Committing => v1::Step::Committing,
        Step::Idle => v1::Step::Idle,
    }
}

/// The domain fail kind of a wire one; `None` for an unspecified or unknown value.
pub fn fail_kind_from_wire(raw: i32) -> Option<FailKind> {
    Some(match v1::FailKind::try_from(raw).ok()? {
        v1::FailKind::Unspecified => return None,
        v1::FailKind::AgentFailed => FailKind::AgentFailed,
        v1::FailKind::AgentTimeout => FailKind::AgentTimeout,
        v1::FailKind::VerificationFailed => FailKind::VerificationFailed,
        v1::FailKind::CommitFailed => FailKind::CommitFailed,
        v1::FailKind::RateLimited => FailKind::RateLimited,
        v1::FailKind::Checkpoint => FailKind::Checkpoint,
        v1::FailKind::Escalated => FailKind::Escalated,
        v1::FailKind::AgentMissing => FailKind::AgentMissing,
        v1::FailKind::AuthFailed => FailKind::AuthFailed,
        v1::FailKind::ApiUnreachable => FailKind::ApiUnreachable,
        v1::FailKind::Environment => FailKind::Environment,
    })
}

/// The wire fail kind of a domain one.
pub fn fail_kind_to_wire(k: FailKind) -> v1::FailKind {
    match k {
        FailKind::AgentFailed => v1::FailKind::AgentFailed,
        FailKind::AgentTimeout => v1::FailKind::AgentTimeout,
        FailKind::VerificationFailed => v1::FailKind::VerificationFailed,
        FailKind::CommitFailed => v1::FailKind::CommitFailed,
        FailKind::RateLimited => v1::FailKind::RateLimited,
        FailKind::Checkpoint => v1::FailKind::Checkpoint,
        FailKind::Escalated => v1::FailKind::Escalated,
        FailKind::AgentMissing => v1::FailKind::AgentMissing,
        FailKind::AuthFailed => v1::FailKind::AuthFailed,
        FailKind::ApiUnreachable => v1::FailKind::ApiUnreachable,
        FailKind::Environment => v1::FailKind::Environment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips_and_unknown_ones_are_refused() {
        for s in Step::ALL {
            assert_eq!(step_from_wire(step_to_wire(*s) as i32), Some(*s));
        }
        for k in FailKind::ALL {
            assert_eq!(fail_kind_from_wire(fail_kind_to_wire(*k) as i32), Some(*k));
        }
        assert_eq!(step_from_wire(0), None);
        assert_eq!(step_from_wire(999), None);
        assert_eq!(fail_kind_from_wire(-3), None);
    }
}
