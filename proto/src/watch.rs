//! `Watch` deltas: after its first status, a watcher that asked for deltas
//! (`WatchRequest.deltas`) gets in each event only the tasks, workers and levels that changed,
//! with every other field of the status whole. [`Delta`] makes them on zergd's side, one per
//! stream, remembering a fingerprint of each entry it sent (not the entry); [`apply`] folds
//! one into the status the client holds. At 10,000 tasks a whole status is megabytes; a delta
//! is the handful of entries an event changed.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use prost::Message;

use crate::v1;

/// A fingerprint of an entry as the wire encodes it.
fn print(m: &impl Message) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.encode_to_vec().hash(&mut h);
    h.finish()
}

/// What one map held when it was last sent: a fingerprint per key.
#[derive(Debug, Default)]
struct Sent(HashMap<String, u64>);

impl Sent {
    /// Keeps the entries of `now` that changed since the last send, and returns the keys that
    /// are gone.
    fn changed<M: Message>(&mut self, now: &mut HashMap<String, M>) -> Vec<String> {
        let mut seen = HashSet::with_capacity(now.len());
        now.retain(|k, v| {
            seen.insert(k.clone());
            let p = print(v);
            match self.0.get_mut(k) {
                Some(old) if *old == p => false,
                Some(old) => {
                    *old = p;
                    true
                }
                None => {
                    self.0.insert(k.clone(), p);
                    true
                }
            }
        });
        let mut gone: Vec<String> = self
            .0
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.sort();
        for k in &gone {
            self.0.remove(k);
        }
        gone
    }
}

/// The delta-maker of one watch stream.
#[derive(Debug, Default)]
pub struct Delta {
    started: bool,
    tasks: Sent,
    workers: Sent,
    levels: Sent,
}

impl Delta {
    /// Turns the whole `status` into what this stream sends: itself the first time, a delta
    /// after.
    pub fn event(&mut self, mut status: v1::RushStatus, ev: v1::WatchEvent) -> v1::WatchEvent {
        let removed_tasks = self.tasks.changed(&mut status.tasks);
        let removed_workers = self.workers.changed(&mut status.workers);
        let removed_levels = self.levels.changed(&mut status.levels);
        let delta = std::mem::replace(&mut self.started, true);
        v1::WatchEvent {
            status: Some(status),
            delta,
            removed_tasks,
            removed_workers,
            removed_levels,
            ..ev
        }
    }
}

/// Moves the held entries into `new`, less those `gone`, under the ones `new` already has.
fn merge<M>(held: &mut HashMap<String, M>, new: &mut HashMap<String, M>, gone: &[String]) {
    let mut all = std::mem::take(held);
    for k in gone {
        all.remove(k);
    }
    all.extend(new.drain());
    *new = all;
}

/// Folds an event's status into `held`, the status the client has: a whole status replaces it,
/// a delta updates the entries it names and every other field. Returns whether the event had a
/// status at all.
pub fn apply(held: &mut Option<v1::RushStatus>, ev: &mut v1::WatchEvent) -> bool {
    let Some(status) = ev.status.take() else {
        return false;
    };
    match held {
        Some(h) if ev.delta => {
            let mut next = status;
            merge(&mut h.tasks, &mut next.tasks, &ev.removed_tasks);
            merge(&mut h.workers, &mut next.workers, &ev.removed_workers);
            merge(&mut h.levels, &mut next.levels, &ev.removed_levels);
            *h = next;
        }
        _ => *held = Some(status),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(tasks: &[(&str, i32)], workers: &[&str]) -> v1::RushStatus {
        v1::RushStatus {
            feature: "f".into(),
            tasks: tasks
                .iter()
                .map(|(k, s)| {
                    (
                        k.to_string(),
                        v1::TaskStatus {
                            status: *s,
                            ..Default::default()
                        },
                    )
                })
                .collect(),
            workers: workers
                .iter()
                .map(|k| (k.to_string(), v1::WorkerStatus::default()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_stream_sends_the_whole_status_then_what_changed_and_the_client_rebuilds_it() {
        let mut d = Delta::default();
        let mut held = None;
        let s1 = status(&[("A", 1), ("B", 1), ("C", 1)], &["0", "1"]);
        let mut e = d.event(s1.clone(), v1::WatchEvent::default());
        assert!(!e.delta, "the first is whole");
        assert_eq!(e.status.as_ref().unwrap().tasks.len(), 3);
        assert!(apply(&mut held, &mut e));
        assert_eq!(held.as_ref(), Some(&s1));

        // B completes, worker 1 goes away, the rush's scalars move on.
        let mut s2 = status(&[("A", 1), ("B", 4), ("C", 1)], &["0"]);
        s2.current_level = 2;
        let mut e = d.event(s2.clone(), v1::WatchEvent::default());
        assert!(e.delta);
        let sent = e.status.as_ref().unwrap();
        assert_eq!(
            sent.tasks.keys().collect::<Vec<_>>(),
            vec!["B"],
            "only what changed"
        );
        assert!(sent.workers.is_empty());
        assert_eq!(e.removed_workers, vec!["1".to_string()]);
        assert!(apply(&mut held, &mut e));
        assert_eq!(
            held.as_ref(),
            Some(&s2),
            "the client's status is the whole new one"
        );

        // Nothing changed: an empty delta, and the same status.
        let mut e = d.event(s2.clone(), v1::WatchEvent::default());
        assert!(e.status.as_ref().unwrap().tasks.is_empty());
        assert!(apply(&mut held, &mut e));
        assert_eq!(held.as_ref(), Some(&s2));

        // An event without a status changes nothing.
        let mut bare = v1::WatchEvent::default();
        assert!(!apply(&mut held, &mut bare));
        assert_eq!(held.as_ref(), Some(&s2));
    }
}
