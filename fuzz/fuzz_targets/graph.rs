//! Fuzzes the task-graph validator, `zerg_proto::graph::parse`, with arbitrary bytes as the
//! `task-graph.json` file. It must return (accept or refuse) and never panic; an accepted
//! graph is also walked the way zergd walks it.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use zerg_proto::graph::{GraphError, parse};

fuzz_target!(|data: &[u8]| {
    match parse(data, Path::new("task-graph.json")) {
        Ok(v) => {
            let g = &v.graph;
            let _ = g.levels();
            let _ = g.max_level();
            if let Some(first) = g.tasks.first() {
                let _ = g.dependents_closure(&first.id);
                assert!(g.task(&first.id).is_some());
            }
        }
        Err(GraphError::Invalid { errors, .. }) => {
            assert!(
                !errors.is_empty(),
                "a refused graph names at least one error"
            );
            for e in &errors {
                let _ = e.to_string();
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
