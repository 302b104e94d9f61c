//! The checks across tasks: ids, dependencies, levels, file ownership, cycles, and the
//! optional `levels` object.

use super::read::{Collector, Draft};
use super::*;

/// Rules that need every task: duplicate ids, dependency existence and levels, cycles, level
/// contiguity, per-level file ownership, and the hygiene warnings.
pub(super) fn check_cross_task(drafts: &[Draft], cx: &mut Collector) {
    // Id -> position in `drafts` of its first definition.
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for (pos, draft) in drafts.iter().enumerate() {
        let Some(id) = draft.id.as_deref() else {
            continue;
        };
        if let Some(&first) = by_id.get(id) {
            cx.error(
                draft.label(),
                "id",
                format!(
                    "duplicate task id '{id}': tasks[{}] reuses the id of tasks[{}]",
                    draft.index, drafts[first].index
                ),
            );
        } else {
            by_id.insert(id, pos);
        }
    }

    // Dependencies: existence, self-reference, strictly lower level. Build the edge lists.
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); drafts.len()];
    for (pos, draft) in drafts.iter().enumerate() {
        for (_, dep) in &draft.dependencies {
            if draft.id.as_deref() == Some(dep.as_str()) {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!("task depends on itself ('{dep}')"),
                );
                continue;
            }
            let Some(&target) = by_id.get(dep.as_str()) else {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!("dependency '{dep}' does not exist"),
                );
                continue;
            };
            if target == pos {
                // A later duplicate naming its own id: already reported as a duplicate.
                continue;
            }
            if let (Some(own), Some(theirs)) = (draft.level, drafts[target].level)
                && theirs >= own
            {
                cx.error(
                    draft.label(),
                    "dependencies",
                    format!(
                        "dependency '{dep}' is at level {theirs}, \
                         which is not lower than this task's level {own}"
                    ),
                );
            }
            edges[pos].push(target);
            dependents[target].push(pos);
        }
    }

    check_cycles(drafts, &edges, cx);

    // Levels must be contiguous from 1.
    let levels: BTreeSet<u32> = drafts.iter().filter_map(|d| d.level).collect();
    let max_level = levels.last().copied().unwrap_or(0);
    let mut expected = 1u32;
    for &level in &levels {
        if level > expected {
            let message = if level - expected == 1 {
                format!("level {expected} has no tasks; levels must be contiguous from 1")
            } else {
                format!(
                    "levels {expected} to {} have no tasks; levels must be contiguous from 1",
                    level - 1
                )
            };
            cx.error(None, "level", message);
        }
        expected = level.saturating_add(1);
    }

    // File ownership: exclusive within a level over create ∪ modify.
    let mut owners: HashMap<(u32, &str), &str> = HashMap::new();
    for draft in drafts {
        let Some(level) = draft.level else { continue };
        let mut own: HashSet<&str> = HashSet::new();
        for (kind, list) in [("create", &draft.create), ("modify", &draft.modify)] {
            for (i, path) in list {
                if validate_file_path(path).is_err() || !own.insert(path.as_str()) {
                    continue;
                }
                if let Some(owner) = owners.get(&(level, path.as_str())) {
                    cx.error(
                        draft.label(),
                        format!("files.{kind}[{i}]"),
                        format!(
                            "file '{path}' is claimed (create/modify) by both {owner} and {} \
                             at level {level}; within a level a file may be owned by only one task",
                            draft.label
                        ),
                    );
                } else {
                    owners.insert((level, path.as_str()), &draft.label);
                }
            }
        }
    }

    // Warnings: consumers.
    for draft in drafts {
        if !draft.consumers.is_empty() && draft.integration_test.is_none() {
            cx.warn(
                draft.label(),
                "integration_test",
                "task has consumers but no integration_test",
            );
        }
        for (_, consumer) in &draft.consumers {
            if !by_id.contains_key(consumer.as_str()) {
                cx.warn(
                    draft.label(),
                    "consumers",
                    format!("consumer '{consumer}' does not exist"),
                );
            }
        }
    }

    // Warnings: unreachable tasks (no dependency chain down to level 1).
    let mut reachable = vec![false; drafts.len()];
    let mut queue: Vec<usize> = (0..drafts.len())
        .filter(|&p| drafts[p].level == Some(1))
        .collect();
    for &p in &queue {
        reachable[p] = true;
    }
    while let Some(p) = queue.pop() {
        for &d in &dependents[p] {
            if !reachable[d] {
                reachable[d] = true;
                queue.push(d);
            }
        }
    }
    for (pos, draft) in drafts.iter().enumerate() {
        let Some(level) = draft.level.filter(|&l| l >= 2) else {
            continue;
        };
        if !reachable[pos] {
            cx.warn(
                draft.label(),
                "dependencies",
                format!(
                    "task at level {level} is unreachable: \
                     it has no dependency chain down to a level-1 task"
                ),
            );
        }
        // Orphans: nothing depends on it, not at the final level, no consumers.
        if dependents[pos].is_empty() && level < max_level && draft.consumers.is_empty() {
            cx.warn(
                draft.label(),
                "consumers",
                format!(
                    "orphan task: no task depends on it and it lists no consumers, \
                     although it is at level {level} below the final level {max_level}"
                ),
            );
        }
    }
}

/// At most this many dependency cycles are reported one by one; the others are counted in one
/// more error, so a hostile graph with many back edges cannot make the report quadratic.
pub(super) const MAX_REPORTED_CYCLES: usize = 10;

/// A reported cycle names at most this many tasks; longer cycles are shortened in the middle.
pub(super) const MAX_CYCLE_NAMES: usize = 20;

/// Reports each dependency cycle once (found by iterative DFS; one cycle per back edge), at
/// most [`MAX_REPORTED_CYCLES`] of them. Runs in time linear in tasks plus dependencies (plus
/// the length of the reported cycles) and never recurses, so a 100,000-deep chain is fine.
pub(super) fn check_cycles(drafts: &[Draft], edges: &[Vec<usize>], cx: &mut Collector) {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut mark = vec![Mark::New; drafts.len()];
    // Position of each on-stack node in `stack`, so a back edge finds its cycle in O(1).
    let mut stack_pos = vec![0usize; drafts.len()];
    let mut reported: HashSet<Vec<usize>> = HashSet::new();
    let mut unreported = 0usize;
    for root in 0..drafts.len() {
        if mark[root] != Mark::New {
            continue;
        }
        // Stack of (node, index of the next edge to follow).
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        mark[root] = Mark::OnStack;
        stack_pos[root] = 0;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            let Some(&target) = edges[node].get(*next) else {
                mark[node] = Mark::Done;
                stack.pop();
                continue;
            };
            *next += 1;
            match mark[target] {
                Mark::New => {
                    mark[target] = Mark::OnStack;
                    stack_pos[target] = stack.len();
                    stack.push((target, 0));
                }
                Mark::OnStack if reported.len() >= MAX_REPORTED_CYCLES => unreported += 1,
                Mark::OnStack => {
                    let start = stack_pos[target];
                    let mut cycle: Vec<usize> = stack[start..].iter().map(|&(n, _)| n).collect();
                    let min_at = cycle
                        .iter()
                        .enumerate()
                        .min_by_key(|&(_, &n)| n)
                        .map_or(0, |(i, _)| i);
                    cycle.rotate_left(min_at);
                    let (first, message) = (cycle[0], cycle_message(drafts, &cycle));
                    if reported.insert(cycle) {
                        cx.error(drafts[first].label(), "dependencies", message);
                    }
                }
                Mark::Done => {}
            }
        }
    }
    if unreported > 0 {
        cx.error(
            None,
            "tasks",
            format!(
                "{unreported} more dependency cycles were found and are not listed \
                 (only the first {MAX_REPORTED_CYCLES} are)"
            ),
        );
    }
}

/// `dependency cycle: A -> B -> C -> A`, shortened to [`MAX_CYCLE_NAMES`] names.
fn cycle_message(drafts: &[Draft], cycle: &[usize]) -> String {
    let name = |n: usize| drafts[n].label.as_str();
    let mut names: Vec<String> = Vec::with_capacity(MAX_CYCLE_NAMES + 2);
    if cycle.len() <= MAX_CYCLE_NAMES {
        names.extend(cycle.iter().map(|&n| name(n).to_owned()));
    } else {
        let head = MAX_CYCLE_NAMES / 2;
        let tail = MAX_CYCLE_NAMES - head;
        names.extend(cycle[..head].iter().map(|&n| name(n).to_owned()));
        names.push(format!(
            "... ({} more tasks) ...",
            cycle.len() - head - tail
        ));
        names.extend(
            cycle[cycle.len() - tail..]
                .iter()
                .map(|&n| name(n).to_owned()),
        );
    }
    if let Some(&first) = cycle.first() {
        names.push(name(first).to_owned());
    }
    if cycle.len() > MAX_CYCLE_NAMES {
        format!(
            "dependency cycle of {} tasks: {}",
            cycle.len(),
            names.join(" -> ")
        )
    } else {
        format!("dependency cycle: {}", names.join(" -> "))
    }
}

/// The optional top-level `levels` object: `{"1": {"name": "...", "tasks": ["ID", ...]}, ...}`.
pub(super) fn check_levels_object(value: &Value, drafts: &[Draft], cx: &mut Collector) {
    let Value::Object(levels) = value else {
        cx.error(
            None,
            "levels",
            format!(
                "must be an object keyed by level number, not {}",
                json_type(value)
            ),
        );
        return;
    };
    let task_levels: HashMap<&str, Option<u32>> = drafts
        .iter()
        .filter_map(|d| d.id.as_deref().map(|id| (id, d.level)))
        .collect();
    for (key, entry) in levels {
        let base = format!("levels.{key}");
        let level = key
            .parse::<u32>()
            .ok()
            .filter(|&l| l >= 1 && !key.starts_with('+'));
        if level.is_none() {
            cx.error(
                None,
                &base,
                format!("key '{key}' must be a level number (an integer >= 1)"),
            );
        }
        let Value::Object(entry) = entry else {
            cx.error(
                None,
                &base,
                format!(
                    "must be an object with `name` and `tasks`, not {}",
                    json_type(entry)
                ),
            );
            continue;
        };
        match entry.get("name") {
            Some(Value::String(_)) => {}
            None => cx.error(None, format!("{base}.name"), "missing required field"),
            Some(other) => cx.error(
                None,
                format!("{base}.name"),
                format!("must be a string, not {}", json_type(other)),
            ),
        }
        let field = format!("{base}.tasks");
        let Some(ids) = (match entry.get("tasks") {
            None => {
                cx.error(None, &field, "missing required field");
                None
            }
            Some(v) => read_string_list(v, None, &field, true, cx),
        }) else {
            continue;
        };
        for (i, id) in ids {
            match task_levels.get(id.as_str()) {
                None => cx.error(
                    None,
                    format!("{field}[{i}]"),
                    format!("task '{id}' does not exist"),
                ),
                Some(&Some(actual)) if level.is_some_and(|l| l != actual) => cx.warn(
                    None,
                    format!("{field}[{i}]"),
                    format!("task '{id}' is listed under level {key} but has level {actual}"),
                ),
                Some(_) => {}
            }
        }
    }
}
