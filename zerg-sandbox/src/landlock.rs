//! Landlock, the second wall: inside the namespaces, the worker agent restricts itself (and so
//! everything it starts) to writing only the policy's read-write paths, with signals and
//! abstract Unix sockets scoped to the sandbox where the kernel has them (ABI 6). A read-only
//! bind mount already refuses writes; Landlock still holds if a mount were changed.
//!
//! It is applied best-effort: a kernel without Landlock leaves the namespaces as the only wall,
//! and the ABI that was enforced is reported.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, LandlockStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

/// The newest ABI whose rights are asked for.
const ABI_WANTED: ABI = ABI::V6;

/// Restricts this process (call it before any thread is started): reads and runs anywhere it
/// can see, writes only beneath `writable`. Returns the ABI the kernel enforced (0: none).
pub fn restrict_self(writable: &[PathBuf]) -> Result<u32, String> {
    let all = AccessFs::from_all(ABI_WANTED);
    let read = AccessFs::from_read(ABI_WANTED);
    let writable: Vec<&Path> = writable
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| p.exists())
        .collect();
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], read)))
        .and_then(|r| r.add_rules(path_beneath_rules(&writable, all)))
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("Landlock: {e}"))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Ok(0);
    }
    Ok(match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as u32,
        _ => 0,
    })
}
