//! Ended rushes are released: once a rush has ended and nothing of it is still running (no
//! worker, no background job, no `Watch` client), zergd folds its journal into its state file,
//! closes its worker plane, its monitor files and their writer thread, drops its symbol map
//! and its whole in-memory state, and keeps only its registry entry (a few hundred bytes) for
//! `list`. `status`, `logs`, `watch`, `stop`, `retry` and a resume load it from disk again,
//! exactly as a restarted zergd does. So a zergd that runs rush after rush for weeks holds
//! only what its live rushes need.

use super::*;
use crate::calls::PrunedRush;

/// What a command sees of a rush zergd knows, loaded or parked.
pub(super) struct Known<'a> {
    /// Rush id.
    pub id: &'a str,
    /// Repository path.
    pub repo: &'a str,
    /// Feature name.
    pub feature: &'a str,
    /// Start time (RFC 3339), which orders rushes.
    pub started_at: &'a str,
    /// Its state.
    pub state: RushState,
}

impl Supervisor {
    /// Every rush zergd knows, whole or parked.
    pub(super) fn known(&self) -> impl Iterator<Item = Known<'_>> {
        let loaded = self.rushes.values().map(|r| Known {
            id: r.id(),
            repo: &r.doc.rush.repo,
            feature: &r.doc.feature,
            started_at: &r.doc.started_at,
            state: r.state(),
        });
        let parked = self.parked.values().map(|e| Known {
            id: &e.rush_id,
            repo: &e.repo,
            feature: &e.feature,
            started_at: &e.summary.started_at,
            state: e.state,
        });
        loaded.chain(parked)
    }

    /// The `list` line of every rush zergd knows, oldest first.
    pub(super) fn summaries(&self) -> Vec<RegistryEntry> {
        let mut rushes: Vec<RegistryEntry> = self
            .rushes
            .values()
            .map(super::registry_entry)
            .chain(self.parked.values().cloned())
            .collect();
        rushes.sort_by(|a, b| a.summary.started_at.cmp(&b.summary.started_at));
        rushes
    }

    /// Makes a parked rush whole again, from its files; a no-op for a loaded one.
    pub(super) fn unpark(&mut self, id: &str) -> Result<(), SupervisorError> {
        if self.rushes.contains_key(id) {
            return Ok(());
        }
        let Some(entry) = self.parked.get(id) else {
            return Err(SupervisorError::not_found(format!(
                "zergd knows no rush {id}"
            )));
        };
        let r = match load_rush(entry, self.clock.now()) {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Err(SupervisorError::not_found(format!(
                    "the state file of the ended rush {} of {} is gone (pruned?)",
                    entry.feature, entry.repo
                )));
            }
            Err(why) => {
                return Err(SupervisorError::failed_precondition(format!(
                    "cannot load the ended rush {} of {}: {why}",
                    entry.feature, entry.repo
                )));
            }
        };
        self.parked.remove(id);
        self.rushes.insert(id.to_string(), r);
        Ok(())
    }

    /// Parks every ended rush that holds nothing live any more, and lets go of the `Watch`
    /// clients that have gone.
    pub(super) fn park_ended(&mut self) {
        self.watchers.retain(|_, ws| {
            ws.retain(|w| !w.sink.is_closed());
            !ws.is_empty()
        });
        let idle: Vec<String> = self
            .rushes
            .values()
            .filter(|r| {
                r.is_terminal()
                    && !r.dirty
                    && !r.merging
                    && !r.indexing
                    && r.live_workers().is_empty()
                    && !self.inflight.contains_key(r.id())
                    && !self.watchers.contains_key(r.id())
            })
            .map(|r| r.id().to_string())
            .collect();
        for id in idle {
            self.park(&id);
        }
    }

    /// Releases everything a rush holds but its registry entry.
    fn park(&mut self, id: &str) {
        let Some(mut r) = self.rushes.remove(id) else {
            return;
        };
        // The state file is whole once parked: the journal is folded in and closed.
        if let Err(e) = r.journal.compact_if_journaled(&mut r.doc) {
            tracing::warn!(error = %crate::error::chain(&e), rush = %id, "cannot compact the state journal");
        }
        let state = r.state();
        self.parked.insert(id.to_string(), registry_entry(&r));
        self.close_plane(id);
        // A rush loaded from an older registry (no summary) or from a state file that ended
        // while zergd was down: its entry is written now.
        if self.registered.get(id) != Some(&state) {
            self.save_registry();
        }
        self.inflight.remove(id);
        tracing::debug!(rush = %id, feature = %r.doc.feature, "ended rush released");
    }
}

/// Loads a rush whole from its state file and spec snapshot, as recovery does; `None` when its
/// state file is gone or now holds another rush of the feature.
pub(super) fn load_rush(e: &RegistryEntry, now: Instant) -> Result<Option<Rush>, String> {
    let repo = PathBuf::from(&e.repo);
    let store = StateStore::new(&repo.join(".zerg").join("state"), &e.feature);
    let (mut doc, note) = match store.load_noting_backup() {
        Ok(Some((d, note))) if d.rush.rush_id == e.rush_id => (d, note),
        Ok(_) => return Ok(None),
        Err(err) => return Err(err.to_string()),
    };
    if let Some(note) = &note {
        doc.rush.warnings.push(note.clone());
    }
    let (graph, config, paths, spec_context) = jobs::load_snapshot(&repo, &e.feature)
        .map_err(|why| format!("cannot load the rush's snapshot: {why}"))?;
    let mut r = Rush::new(doc, graph, config, paths, spec_context, now);
    r.escalations = super::escalations::load_escalations(&r);
    // Resuming from the backup rewrites the state file at once.
    r.dirty = note.is_some();
    Ok(Some(r))
}

impl Supervisor {
    /// `zergctl prune`: forgets the repository's ended rushes that match, then removes their
    /// files in the background and answers with what went and what stayed.
    pub(super) fn prune(
        &mut self,
        req: PruneRequest,
        reply: Reply<PruneReport>,
        wall: std::time::SystemTime,
    ) {
        let Some((repo, repo_s, reply)) = resolved(&req.repo, reply) else {
            return;
        };
        let older_than = req.older_than;
        let mut listed: Vec<(String, String, RushState)> = self
            .known()
            .filter(|k| k.repo == repo_s && (req.feature.is_empty() || k.feature == req.feature))
            .map(|k| (k.id.to_string(), k.feature.to_string(), k.state))
            .collect();
        if !req.feature.is_empty() && listed.is_empty() {
            let _ = reply.send(Err(SupervisorError::not_found(format!(
                "no rush for feature '{}' in {repo_s}",
                req.feature
            ))));
            return;
        }
        listed.sort();
        let mut report = Vec::new();
        let mut jobs = Vec::new();
        for (id, feature, state) in listed {
            let finished_at = match self.rushes.get(&id) {
                Some(r) => r.doc.rush.finished_at.clone(),
                None => self.parked[&id].summary.finished_at.clone(),
            };
            let mut row = PrunedRush {
                feature: feature.clone(),
                rush_id: id.clone(),
                state,
                finished_at: finished_at.clone(),
                ..Default::default()
            };
            let why_kept = if !state.is_terminal() {
                Some(format!(
                    "{state}: prune takes only ended rushes (`zergctl stop {feature}` first)"
                ))
            } else if self
                .rushes
                .get(&id)
                .is_some_and(|r| !r.live_workers().is_empty())
            {
                Some("its workers are still exiting".to_string())
            } else {
                ended_within(&finished_at, older_than, wall)
                    .map(|ago| format!("ended {ago} ago, within --older-than"))
            };
            if let Some(why) = why_kept {
                row.kept.push(why);
                report.push(row);
                continue;
            }
            row.pruned = true;
            jobs.push((row, feature));
        }
        let pruned_ids: HashSet<String> = jobs.iter().map(|(r, _)| r.rush_id.clone()).collect();
        // The logs are the repository's: they go with its last rush.
        let last = self
            .known()
            .all(|k| k.repo != repo_s || pruned_ids.contains(k.id));
        if !req.dry_run && !pruned_ids.is_empty() {
            for id in &pruned_ids {
                self.rushes.remove(id);
                self.parked.remove(id);
                self.close_plane(id);
                self.watchers.remove(id);
            }
            let mut reg = Registry::load(&self.settings.registry_path);
            reg.rushes.retain(|e| !pruned_ids.contains(&e.rush_id));
            if let Err(e) = reg.save(&self.settings.registry_path) {
                tracing::warn!(error = %e, "cannot save the rush registry");
            }
            self.registered.retain(|id, _| !pruned_ids.contains(id));
        }
        let dry_run = req.dry_run;
        let branches = req.branches;
        tokio::task::spawn_blocking(move || {
            let n = jobs.len();
            for (i, (mut row, feature)) in jobs.into_iter().enumerate() {
                let out = crate::disk::prune(&crate::disk::PruneJob {
                    repo: repo.clone(),
                    feature,
                    dry_run,
                    branches,
                    // Listed once, with the last rush pruned.
                    logs: last && i + 1 == n,
                });
                row.removed = out.removed;
                row.kept = out.kept;
                row.bytes = out.bytes;
                report.push(row);
            }
            report.sort_by(|a, b| a.feature.cmp(&b.feature));
            let _ = reply.send(Ok(PruneReport {
                rushes: report,
                dry_run,
            }));
        });
    }
}

/// How long ago a rush that ended at `finished_at` ended, when that is less than `older_than`;
/// `None` when it is older (or the time is unknown, as for a rush stopped before it began).
fn ended_within(
    finished_at: &str,
    older_than: Duration,
    wall: std::time::SystemTime,
) -> Option<String> {
    let at = humantime::parse_rfc3339_weak(finished_at).ok()?;
    let ago = wall.duration_since(at).unwrap_or_default();
    (ago < older_than)
        .then(|| humantime::format_duration(Duration::from_secs(ago.as_secs())).to_string())
}

/// The repository a request names (its root, and that as a string), or `None` once the caller
/// has been told why there is none.
pub(super) fn resolved<T>(repo: &str, reply: Reply<T>) -> Option<(PathBuf, String, Reply<T>)> {
    match jobs::resolve_repo(repo) {
        Ok(r) => {
            let s = r.to_string_lossy().to_string();
            Some((r, s, reply))
        }
        Err(e) => {
            let _ = reply.send(Err(e));
            None
        }
    }
}
