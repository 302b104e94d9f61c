//! Merge conflicts resolved by an agent (`merge.resolve: agent`). When merging a worker's
//! branch into staging conflicts, the merge is committed as it stands, conflict markers and
//! all, and a resolution task `RESOLVE-L<level>-W<worker>` joins the level: its worktree starts
//! from that commit, its prompt names the conflicted files and the tasks whose work meets
//! there, and it must leave no marker and pass each of those tasks' verifications. Once it is
//! done, staging moves to its commit and the level's merge goes on with the branches still to
//! merge (then the quality gates run as for any merge). A resolution that fails for good leaves
//! the next merge to conflict again, and the rush pauses naming the files, as without it.

use super::*;
use crate::state::{Resolution, TaskState};

/// Lines that are git's conflict markers (`<<<<<<< ours`, `>>>>>>> theirs`).
const MARKERS: &str = "^(<<<<<<<|>>>>>>>)( |$)";

impl Rush {
    /// Whether a conflict of `worker`'s branch at `level` can go to an agent: no resolution of
    /// it was tried before.
    pub(super) fn resolvable(&self, level: u32, worker: u32) -> bool {
        !self.doc.tasks.contains_key(&resolution_id(level, worker))
    }

    /// Queues the resolution task of a conflict: `base` is the merge committed with its
    /// markers, `rest` the heads still to merge after it.
    pub(super) fn open_resolution(
        &mut self,
        level: u32,
        worker: u32,
        files: Vec<String>,
        base: String,
        rest: Vec<(u32, String)>,
        wall: SystemTime,
    ) {
        let id = resolution_id(level, worker);
        // The tasks whose work meets in the conflict: the conflicting worker's tasks of the
        // level, and every task of the level that owns a conflicted file or changed one out of
        // its scope.
        let involved: Vec<Task> = self
            .graph
            .tasks
            .iter()
            .filter(|t| t.level == level && self.task_status(&t.id) == Some(TaskStatus::Complete))
            .filter(|t| {
                let state = self.doc.tasks.get(&t.id);
                state.and_then(|x| x.worker_id) == Some(worker)
                    || state.is_some_and(|x| x.out_of_scope.iter().any(|f| files.contains(f)))
                    || t.files
                        .create
                        .iter()
                        .chain(&t.files.modify)
                        .any(|f| files.contains(f))
            })
            .cloned()
            .collect();
        let ids: Vec<&str> = involved.iter().map(|t| t.id.as_str()).collect();
        let mut description = format!(
            "Merging worker {worker}'s branch into staging at level {level} conflicted. Your worktree holds that merge, committed with git's conflict markers (lines starting <<<<<<<, ======= and >>>>>>>) in: {}.\n\nEdit those files so that each keeps what every task below meant, remove every conflict marker, and change nothing else. The verification checks that no marker is left and runs each task's own verification.\n\nThe tasks whose work meets here:\n",
            files.join(", ")
        );
        let mut checks = vec![format!(
            "! grep -n -E '{MARKERS}' -- {}",
            files
                .iter()
                .map(|f| shell_quote(f))
                .collect::<Vec<_>>()
                .join(" ")
        )];
        let mut read: Vec<String> = Vec::new();
        for t in &involved {
            description.push_str(&format!("\n- {} ({}): {}\n", t.id, t.title, t.description));
            description.push_str(&format!(
                "  files: create {:?}, modify {:?}\n",
                t.files.create, t.files.modify
            ));
            if let Some(v) = &t.verification {
                description.push_str(&format!("  verification: {}\n", v.command));
                checks.push(format!("( {} )", v.command));
            }
            for f in t
                .files
                .create
                .iter()
                .chain(&t.files.modify)
                .chain(&t.files.read)
            {
                if !read.contains(f) && !files.contains(f) {
                    read.push(f.clone());
                }
            }
        }
        let res = Resolution {
            task_id: id.clone(),
            worker,
            base,
            files: files.clone(),
            rest,
            title: format!(
                "Resolve the merge conflict in {} ({})",
                files.join(", "),
                ids.join(", ")
            ),
            description,
            read,
            verification: checks.join(" && "),
        };
        self.add_tasks([resolution_task(level, &res)]);
        self.doc.tasks.insert(
            id.clone(),
            TaskState {
                status: TaskStatus::Pending,
                level: Some(level),
                title: res.title.clone(),
                updated_at: iso_millis(wall),
                ..Default::default()
            },
        );
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        ls.merge_status = MergeStatus::Conflict;
        ls.conflicts = files.clone();
        ls.merge_details = Some(format!("resolving with task {id}"));
        ls.resolution = Some(res);
        self.dirty = true;
        self.event(
            wall,
            Source::Orchestrator,
            Level::Warn,
            "merge_conflict_resolution",
            format!(
                "merge conflict at level {level} merging worker {worker}: files {} (tasks {}); resolution task {id} queued",
                files.join(", "),
                ids.join(", ")
            ),
            json!({"level": level, "worker_id": worker, "files": files, "tasks": ids, "task_id": id}),
        );
    }

    /// The commit a resolution task starts from, when `task_id` is one.
    pub(super) fn resolution_base(&self, task_id: &str) -> Option<String> {
        self.doc
            .levels
            .values()
            .filter_map(|l| l.resolution.as_ref())
            .find(|r| r.task_id == task_id)
            .map(|r| r.base.clone())
    }

    /// Puts the resolution tasks recorded in the state back into the graph (which holds only
    /// the spec's tasks when the rush is loaded).
    pub(super) fn restore_resolutions(&mut self) {
        let mut missing = Vec::new();
        for (level, ls) in &self.doc.levels {
            if let (Some(r), Ok(level)) = (&ls.resolution, level.parse::<u32>())
                && self.graph_task(&r.task_id).is_none()
            {
                missing.push(resolution_task(level, r));
            }
        }
        self.add_tasks(missing);
    }

    /// Whether `task_id` is a resolution task (whose attempts `merge.resolve_attempts` bounds).
    pub(super) fn is_resolution(&self, task_id: &str) -> bool {
        self.resolution_base(task_id).is_some()
    }
}

/// The id of the resolution task of `worker`'s conflict at `level`.
fn resolution_id(level: u32, worker: u32) -> String {
    format!("RESOLVE-L{level}-W{worker}")
}

/// A resolution as a task of the graph (so that it is leased, shown and reported like any).
fn resolution_task(level: u32, r: &Resolution) -> Task {
    Task {
        id: r.task_id.clone(),
        title: r.title.clone(),
        description: r.description.clone(),
        level,
        dependencies: Vec::new(),
        files: zerg_proto::graph::Files {
            create: Vec::new(),
            modify: r.files.clone(),
            read: r.read.clone(),
        },
        verification: Some(zerg_proto::graph::Verification {
            command: r.verification.clone(),
            timeout_seconds: 600,
        }),
        estimate_minutes: None,
        consumers: Vec::new(),
        integration_test: None,
        context: None,
        acceptance_criteria: vec![
            "no conflict marker is left in the conflicted files".into(),
            "each task's verification passes".into(),
        ],
    }
}

/// `s` quoted for `sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
