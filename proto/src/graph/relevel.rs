//! Recomputing a graph's levels from its dependencies (`zergctl validate --fix`): each task
//! gets the smallest level its dependencies allow (1 without any, else one more than the
//! highest of theirs). Works on the JSON itself, so that every other field, the tasks' order
//! and the keys' order are kept. Iterative, like the validation: no recursion over tasks.

use std::collections::{HashMap, VecDeque};

use serde_json::{Value, json};

/// A task whose level changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The task's id.
    pub id: String,
    /// Its level before (`None`: it had none, or not a number).
    pub from: Option<u64>,
    /// Its level now.
    pub to: u32,
}

/// Most cycles named when a graph has some.
const CYCLES_NAMED: usize = 5;

/// Sets each task's `level` in `root` (a task graph's JSON) to the smallest its dependencies
/// allow, and rebuilds the optional top-level `levels` object to match (keeping the names of
/// the levels it had). Returns the tasks that moved, in the graph's order. Refuses, changing
/// nothing, a graph whose tasks lack ids, name dependencies that do not exist, or depend on
/// each other in a cycle (each cycle named, `A → B → A`).
pub fn relevel(root: &mut Value) -> Result<Vec<Moved>, Vec<String>> {
    let tasks = root
        .get("tasks")
        .and_then(Value::as_array)
        .ok_or_else(|| vec!["tasks: missing, or not an array".to_string()])?;
    let mut errors = Vec::new();
    let ids: Vec<String> = tasks
        .iter()
        .map(|t| {
            t.get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        if tasks[i].get("id").and_then(Value::as_str).is_none() {
            errors.push(format!("tasks[{i}].id: missing, or not a string"));
        } else if index.insert(id, i).is_some() {
            errors.push(format!("tasks[{i}].id: '{id}' is used by an earlier task"));
        }
    }
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        let list = match t.get("dependencies") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(list)) => list,
            Some(_) => {
                errors.push(format!("tasks[{i}].dependencies: not an array"));
                continue;
            }
        };
        for (j, d) in list.iter().enumerate() {
            match d.as_str().and_then(|d| index.get(d).map(|&k| (d, k))) {
                Some((_, k)) if k == i => errors.push(format!(
                    "tasks[{i}].dependencies[{j}]: task '{}' depends on itself",
                    ids[i]
                )),
                Some((_, k)) => deps[i].push(k),
                None => errors.push(format!(
                    "tasks[{i}].dependencies[{j}]: {} does not exist",
                    d.as_str()
                        .map_or_else(|| "a non-string entry".to_string(), |d| format!("'{d}'"))
                )),
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }

    // Kahn's order: a task's level is known once all its dependencies' are.
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    for (i, ds) in deps.iter().enumerate() {
        for &d in ds {
            dependents[d].push(i);
        }
    }
    let mut level = vec![0u32; tasks.len()];
    let mut ready: VecDeque<usize> = (0..tasks.len()).filter(|&i| waiting[i] == 0).collect();
    while let Some(i) = ready.pop_front() {
        level[i] = 1 + deps[i].iter().map(|&d| level[d]).max().unwrap_or(0);
        for &n in &dependents[i] {
            waiting[n] -= 1;
            if waiting[n] == 0 {
                ready.push_back(n);
            }
        }
    }
    if level.contains(&0) {
        return Err(cycles(&deps, &level, &ids));
    }

    let mut moved = Vec::new();
    let tasks = root
        .get_mut("tasks")
        .and_then(Value::as_array_mut)
        .expect("checked above");
    for (i, t) in tasks.iter_mut().enumerate() {
        let from = t.get("level").and_then(Value::as_u64);
        if from != Some(u64::from(level[i])) {
            moved.push(Moved {
                id: ids[i].clone(),
                from,
                to: level[i],
            });
            t["level"] = json!(level[i]);
        }
    }
    if let Some(Value::Object(levels)) = root.get_mut("levels") {
        let max = level.iter().copied().max().unwrap_or(0);
        let mut rebuilt = serde_json::Map::new();
        for l in 1..=max {
            let name = levels
                .get(&l.to_string())
                .and_then(|e| e.get("name"))
                .and_then(Value::as_str)
                .map_or_else(|| format!("Level {l}"), str::to_string);
            let members: Vec<&str> = (0..ids.len())
                .filter(|&i| level[i] == l)
                .map(|i| ids[i].as_str())
                .collect();
            rebuilt.insert(l.to_string(), json!({"name": name, "tasks": members}));
        }
        *levels = rebuilt;
    }
    Ok(moved)
}

/// The cycles among the tasks whose level could not be set (`level` 0), each as
/// `A → B → A`, at most [`CYCLES_NAMED`] of them.
fn cycles(deps: &[Vec<usize>], level: &[u32], ids: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    // 0: not visited, 1: on the walk being made, 2: done.
    let mut state = vec![0u8; deps.len()];
    for start in 0..deps.len() {
        if level[start] != 0 || state[start] != 0 || found.len() >= CYCLES_NAMED {
            continue;
        }
        // Walk from `start` along unlevelled dependencies until a task repeats: every
        // unlevelled task has one (else its level would be known), so the walk must repeat.
        let mut path = vec![start];
        state[start] = 1;
        let mut cur = start;
        while let Some(&next) = deps[cur].iter().find(|&&d| level[d] == 0) {
            match state[next] {
                1 => {
                    let at = path.iter().position(|&p| p == next).unwrap_or(0);
                    let mut names: Vec<&str> =
                        path[at..].iter().map(|&p| ids[p].as_str()).collect();
                    names.push(&ids[next]);
                    found.push(format!("dependency cycle: {}", names.join(" → ")));
                    break;
                }
                2 => break,
                _ => {
                    state[next] = 1;
                    path.push(next);
                    cur = next;
                }
            }
        }
        for p in path {
            state[p] = 2;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(tasks: Value) -> Value {
        json!({"feature": "f", "tasks": tasks})
    }

    #[test]
    fn levels_become_the_smallest_the_dependencies_allow_and_the_rest_is_kept() {
        let mut g = graph(json!([
            {"id": "A", "title": "a", "level": 3, "files": {"create": ["a"]}},
            {"id": "B", "zeta": 1, "level": 1, "dependencies": ["A"], "alpha": 2},
            {"id": "C", "dependencies": ["A", "B"]},
            {"id": "D", "level": 1}
        ]));
        g["levels"] = json!({"1": {"name": "Foundation", "tasks": ["A", "B", "D"]}});
        let moved = relevel(&mut g).unwrap();
        assert_eq!(
            moved,
            vec![
                Moved {
                    id: "A".into(),
                    from: Some(3),
                    to: 1
                },
                Moved {
                    id: "B".into(),
                    from: Some(1),
                    to: 2
                },
                Moved {
                    id: "C".into(),
                    from: None,
                    to: 3
                },
            ]
        );
        let levels: Vec<u64> = g["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["level"].as_u64().unwrap())
            .collect();
        assert_eq!(levels, vec![1, 2, 3, 1]);
        // The order of the tasks and of each task's keys is the file's.
        let keys: Vec<&String> = g["tasks"][1].as_object().unwrap().keys().collect();
        assert_eq!(keys, vec!["id", "zeta", "level", "dependencies", "alpha"]);
        assert_eq!(
            g["levels"],
            json!({
                "1": {"name": "Foundation", "tasks": ["A", "D"]},
                "2": {"name": "Level 2", "tasks": ["B"]},
                "3": {"name": "Level 3", "tasks": ["C"]}
            })
        );
        // A second run moves nothing.
        assert!(relevel(&mut g).unwrap().is_empty());
    }

    #[test]
    fn cycles_and_missing_dependencies_are_refused_by_name_and_nothing_changes() {
        let mut g = graph(json!([
            {"id": "A", "level": 1, "dependencies": ["C"]},
            {"id": "B", "level": 2, "dependencies": ["A"]},
            {"id": "C", "level": 3, "dependencies": ["B"]},
            {"id": "D", "level": 1, "dependencies": ["C"]},
            {"id": "E", "level": 1, "dependencies": ["E2"]},
            {"id": "E2", "level": 1, "dependencies": ["E"]}
        ]));
        let before = g.clone();
        let errors = relevel(&mut g).unwrap_err();
        assert_eq!(
            errors,
            vec![
                "dependency cycle: A → C → B → A".to_string(),
                "dependency cycle: E → E2 → E".to_string(),
            ]
        );
        assert_eq!(g, before);

        let mut g = graph(json!([{"id": "A", "dependencies": ["nope", 3, "A"]}, {"level": 1}]));
        let errors = relevel(&mut g).unwrap_err();
        assert_eq!(
            errors,
            vec![
                "tasks[1].id: missing, or not a string",
                "tasks[0].dependencies[0]: 'nope' does not exist",
                "tasks[0].dependencies[1]: a non-string entry does not exist",
                "tasks[0].dependencies[2]: task 'A' depends on itself",
            ]
        );
    }

    #[test]
    fn a_long_chain_is_levelled_without_recursion() {
        let n = 100_000;
        let tasks: Vec<Value> = (0..n)
            .map(|i| {
                if i == 0 {
                    json!({"id": "t0"})
                } else {
                    json!({"id": format!("t{i}"), "dependencies": [format!("t{}", i - 1)]})
                }
            })
            .collect();
        let mut g = graph(Value::Array(tasks));
        let moved = relevel(&mut g).unwrap();
        assert_eq!(moved.len(), n);
        assert_eq!(g["tasks"][n - 1]["level"], json!(n));
    }
}
