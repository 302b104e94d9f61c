//! The prompt given to the agent CLI (the original's layout, plus the handoff
//! instructions for escalations and checkpoints, and the `## Relevant Symbols` section zergd
//! computes from its symbol map and sends with the lease: the agent needs no grammar).

use zerg_proto::v1;

/// File the agent CLI writes to escalate, inside `ZERG_TASK_DIR`.
pub const ESCALATION_FILE: &str = "escalation.json";
/// File the agent CLI writes to checkpoint, inside `ZERG_TASK_DIR`.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Builds the prompt for a task.
pub fn build(task: &v1::Task, spec_context: &str) -> String {
    let mut p = String::new();
    if task.context.is_empty() {
        p.push_str(spec_context.trim_end());
    } else {
        p.push_str("# Task Context (Scoped)\n");
        p.push_str(task.context.trim_end());
    }
    p.push_str(&format!(
        "\n\n# Task: {}\nTask ID: {} (level {})\n",
        task.title, task.id, task.level
    ));
    if !task.description.is_empty() {
        p.push_str(&format!(
            "\n## Description\n{}\n",
            task.description.trim_end()
        ));
    }
    let files = [
        ("Create", &task.files_create),
        ("Modify", &task.files_modify),
        ("Reference", &task.files_read),
    ];
    if files.iter().any(|(_, f)| !f.is_empty()) {
        p.push_str("\n## Files\n");
        for (label, list) in files {
            if !list.is_empty() {
                p.push_str(&format!("{label}: {}\n", list.join(", ")));
            }
        }
    }
    let symbols = task.relevant_symbols.trim();
    if !symbols.is_empty() {
        p.push('\n');
        p.push_str(symbols);
        p.push('\n');
    }
    if !task.verification_command.is_empty() {
        p.push_str(&format!(
            "\n## Verification\nCommand: `{}`\n",
            task.verification_command
        ));
    }
    if !task.acceptance_criteria.is_empty() {
        p.push_str("\n## Acceptance Criteria\n");
        for c in &task.acceptance_criteria {
            p.push_str(&format!("- {c}\n"));
        }
    }
    let previous = task.previous_attempt.trim();
    if !previous.is_empty() {
        p.push_str(&format!(
            "\n## Previous attempt\n{previous}\n\nFind out why it failed and fix that; do not repeat it.\n"
        ));
    }
    let notes: Vec<&str> = task
        .notes
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .collect();
    if !notes.is_empty() {
        p.push_str("\n## Notes from the user\nThe user who runs this rush wrote these for this task, oldest first. Where they differ from the task above, follow them.\n");
        for n in notes {
            p.push_str(&format!("\n- {}\n", n.replace('\n', "\n  ")));
        }
    }
    if !task.resume_from.is_empty() {
        p.push_str("\n## Resuming\nAn earlier attempt checkpointed; its changes are already in the working tree. Continue from there.\n");
    }
    p.push_str(&format!(
        "\n## Instructions\n\
Implement the task as specified. Make all necessary changes.\n\
Only change the files listed above.\n\
Do NOT commit - the orchestrator handles commits.\n\
If you cannot do the task because the spec is ambiguous, a dependency is missing, or the verification is unclear, \
do not guess: write a JSON object {{\"category\": \"ambiguous_spec|dependency_missing|verification_unclear\", \"message\": \"...\"}} \
to the file $ZERG_TASK_DIR/{ESCALATION_FILE} and stop.\n\
If you are running out of context before finishing, write {{\"progress_pct\": N, \"next_action\": \"...\"}} to \
$ZERG_TASK_DIR/{CHECKPOINT_FILE} and stop; another worker resumes from your changes.\n"
    ));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_has_every_section() {
        let t = v1::Task {
            id: "A-L1-001".into(),
            title: "Add parser".into(),
            description: "Write it.".into(),
            level: 1,
            files_create: vec!["src/a.rs".into(), "src/b.rs".into()],
            files_modify: vec!["src/lib.rs".into()],
            files_read: vec!["README.md".into()],
            verification_command: "test -f src/a.rs && echo ok".into(),
            acceptance_criteria: vec!["parses".into()],
            ..Default::default()
        };
        let p = build(&t, "# Feature Context: f\nreqs");
        assert!(p.starts_with("# Feature Context: f"));
        assert!(p.contains("# Task: Add parser\nTask ID: A-L1-001 (level 1)"));
        assert!(p.contains("## Description\nWrite it."));
        assert!(p.contains("Create: src/a.rs, src/b.rs\nModify: src/lib.rs\nReference: README.md"));
        assert!(p.contains("Command: `test -f src/a.rs && echo ok`"));
        assert!(p.contains("- parses"));
        assert!(p.contains("Do NOT commit"));
        assert!(p.contains("$ZERG_TASK_DIR/escalation.json"));
    }

    #[test]
    fn the_users_notes_follow_the_previous_attempt_oldest_first() {
        let t = v1::Task {
            id: "T1".into(),
            title: "t".into(),
            previous_attempt: "Attempt 1 failed: tier 1".into(),
            notes: vec!["use the v2 API".into(), "  \n".into(), "two\nlines".into()],
            ..Default::default()
        };
        let p = build(&t, "ctx");
        let at = p.find("## Notes from the user").expect("section");
        assert!(p.find("## Previous attempt").unwrap() < at, "{p}");
        assert!(
            p[at..].contains("- use the v2 API\n\n- two\n  lines\n"),
            "{p}"
        );
        assert!(!build(&v1::Task::default(), "ctx").contains("## Notes"));
    }

    #[test]
    fn the_relevant_symbols_section_follows_the_files_when_there_is_one() {
        let section = "## Relevant Symbols\nDefinitions…\n\n### src/ledger.rs (modified)\n- L3 pub fn post(&mut self) -> bool\n";
        let t = v1::Task {
            id: "T1".into(),
            title: "t".into(),
            files_modify: vec!["src/ledger.rs".into()],
            verification_command: "cargo test".into(),
            relevant_symbols: section.into(),
            ..Default::default()
        };
        let p = build(&t, "# Feature Context: f");
        assert!(
            p.contains("Modify: src/ledger.rs\n\n## Relevant Symbols\nDefinitions…\n\n### src/ledger.rs (modified)\n- L3 pub fn post(&mut self) -> bool\n\n## Verification"),
            "{p}"
        );
        let without = build(
            &v1::Task {
                relevant_symbols: String::new(),
                ..t
            },
            "# Feature Context: f",
        );
        assert!(!without.contains("Relevant Symbols"), "{without}");
    }

    #[test]
    fn scoped_context_replaces_the_feature_context() {
        let t = v1::Task {
            id: "T1".into(),
            title: "t".into(),
            context: "only this".into(),
            ..Default::default()
        };
        let p = build(&t, "# Feature Context: f");
        assert!(p.starts_with("# Task Context (Scoped)\nonly this"));
        assert!(!p.contains("Feature Context"));
    }
}
