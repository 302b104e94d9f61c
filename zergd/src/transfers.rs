//! The worker plane's streams, bounded: base packs sent (`FetchBase`), packs received
//! (`PushObjects`) and artifacts received (`PushArtifact`).
//!
//! A worker runs model-written code with a valid token for its own slot, so every stream it
//! opens is treated as possibly hostile:
//!
//! - a worker holds at most one stream of each kind: a new one cancels the one before it (a
//!   worker that retries after a dropped connection gets the new one at once);
//! - all workers of a zergd hold at most [`MAX_STREAMS`] streams in all; one over that waits a
//!   little for a place, then is refused with `RESOURCE_EXHAUSTED`;
//! - at most [`pack_work_limit`] packs are built or indexed at once (git work is CPU, and the
//!   machine's cores also serve heartbeats, leases and the control API);
//! - a stream that moves no data for [`STREAM_IDLE`] ends, whichever side is silent: no thread
//!   and no place is held for a reader or writer that went away;
//! - artifacts are counted per task attempt and per rush, in files and in bytes
//!   ([`ArtifactCaps`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::Status;

/// Streams the worker plane holds open at once, over all workers and rushes.
pub const MAX_STREAMS: usize = 64;

/// How long a stream may wait for a place before it is refused.
const WAIT_FOR_PLACE: Duration = Duration::from_secs(20);

/// How long a stream may move no data before zergd ends it.
pub const STREAM_IDLE: Duration = Duration::from_secs(60);

/// Packs built or indexed at once: the machine's cores, at least two.
pub fn pack_work_limit() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// The kinds of stream a worker opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `FetchBase`.
    Fetch,
    /// `PushObjects`.
    Push,
    /// `PushArtifact`.
    Artifact,
    /// `FetchCopies`.
    Copies,
}

type Key = (String, u32, Kind);

/// Limits on a remote worker's artifacts, from `container.*` of the rush's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArtifactCaps {
    /// Bytes kept of one artifact (`container.log_max_size`).
    pub file_bytes: u64,
    /// Artifacts per task attempt (`container.artifacts_max_files`).
    pub files: u64,
    /// Bytes per task attempt (`container.artifacts_max_bytes`).
    pub bytes: u64,
    /// Artifacts per rush (`container.rush_artifacts_max_files`).
    pub rush_files: u64,
    /// Bytes per rush (`container.rush_artifacts_max_bytes`).
    pub rush_bytes: u64,
}

impl ArtifactCaps {
    /// The caps of `cfg`.
    pub fn of(cfg: &crate::config::ContainerConfig) -> Self {
        let bytes = |b: &crate::config::ByteSize| b.0.max(0) as u64;
        Self {
            file_bytes: bytes(&cfg.log_max_size),
            files: cfg.artifacts_max_files,
            bytes: bytes(&cfg.artifacts_max_bytes),
            rush_files: cfg.rush_artifacts_max_files,
            rush_bytes: bytes(&cfg.rush_artifacts_max_bytes),
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    files: u64,
    bytes: u64,
}

#[derive(Debug, Default)]
struct Books {
    /// By rush and lease (one lease id per task attempt).
    attempts: HashMap<(String, String), Tally>,
    rushes: HashMap<String, Tally>,
}

/// What the plane's streams hold, shared by every plane of one zergd.
#[derive(Debug)]
pub struct Transfers {
    streams: Arc<Semaphore>,
    pack_work: Arc<Semaphore>,
    live: Mutex<HashMap<Key, (u64, oneshot::Sender<()>)>>,
    next: AtomicU64,
    books: Mutex<Books>,
}

/// A stream's place: its share of [`MAX_STREAMS`], given back when it is dropped, and the
/// signal that a newer stream of the same worker and kind replaced it.
#[derive(Debug)]
pub struct Place {
    transfers: Arc<Transfers>,
    key: Key,
    id: u64,
    _permit: Option<OwnedSemaphorePermit>,
    /// Resolves (with an error) when a newer stream of the same worker and kind opens.
    pub replaced: oneshot::Receiver<()>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut live = lock(&self.transfers.live);
        if live.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            live.remove(&self.key);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An artifact's share of its attempt's and rush's byte budgets, reserved up front.
#[derive(Debug)]
pub struct Reserved {
    /// Bytes of this artifact that may be kept.
    pub bytes: u64,
    /// Which cap set `bytes`, when it was not the per-file one: the config key.
    pub cut_by: Option<&'static str>,
}

impl Transfers {
    /// Limits of `streams` open at once and `pack_work` packs built at once.
    pub fn new(streams: usize, pack_work: usize) -> Arc<Self> {
        Arc::new(Self {
            streams: Arc::new(Semaphore::new(streams)),
            pack_work: Arc::new(Semaphore::new(pack_work)),
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            books: Mutex::new(Books::default()),
        })
    }

    /// A place for a stream of `kind` by worker `worker` of `rush` (whose token was checked):
    /// its previous stream of that kind, if any, is cancelled first. Refused with
    /// `RESOURCE_EXHAUSTED` when the plane stays full.
    pub async fn open(
        self: &Arc<Self>,
        rush: &str,
        worker: u32,
        kind: Kind,
    ) -> Result<Place, Status> {
        let key = (rush.to_string(), worker, kind);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        // Dropping the previous sender tells its stream to end.
        drop(lock(&self.live).insert(key.clone(), (id, tx)));
        let mut place = Place {
            transfers: self.clone(),
            key,
            id,
            _permit: None,
            replaced: rx,
        };
        match tokio::time::timeout(WAIT_FOR_PLACE, self.streams.clone().acquire_owned()).await {
            Ok(Ok(p)) => {
                place._permit = Some(p);
                Ok(place)
            }
            _ => Err(Status::resource_exhausted(format!(
                "zergd holds {MAX_STREAMS} worker streams already; try again later"
            ))),
        }
    }

    /// Waits for a turn to build or index a pack.
    pub async fn pack_work(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        self.pack_work
            .clone()
            .acquire_owned()
            .await
            .expect("the pack-work semaphore is never closed")
    }

    /// Counts one more artifact of the attempt `lease` in `rush` and reserves the bytes it may
    /// keep; an error names the cap (its config key) that refuses it.
    pub fn reserve_artifact(
        &self,
        rush: &str,
        lease: &str,
        caps: &ArtifactCaps,
    ) -> Result<Reserved, String> {
        let mut guard = lock(&self.books);
        let b = &mut *guard;
        let attempt = b
            .attempts
            .get(&(rush.to_string(), lease.to_string()))
            .copied()
            .unwrap_or_default();
        let whole = b.rushes.get(rush).copied().unwrap_or_default();
        if attempt.files >= caps.files {
            return Err(format!(
                "more than {} artifacts for one task attempt (container.artifacts_max_files)",
                caps.files
            ));
        }
        if whole.files >= caps.rush_files {
            return Err(format!(
                "more than {} artifacts for the rush (container.rush_artifacts_max_files)",
                caps.rush_files
            ));
        }
        let attempt_room = caps.bytes.saturating_sub(attempt.bytes);
        let rush_room = caps.rush_bytes.saturating_sub(whole.bytes);
        if attempt_room == 0 {
            return Err(format!(
                "the task attempt's artifacts reached {} bytes (container.artifacts_max_bytes)",
                caps.bytes
            ));
        }
        if rush_room == 0 {
            return Err(format!(
                "the rush's artifacts reached {} bytes (container.rush_artifacts_max_bytes)",
                caps.rush_bytes
            ));
        }
        let (bytes, cut_by) = if caps.file_bytes <= attempt_room.min(rush_room) {
            (caps.file_bytes, None)
        } else if attempt_room <= rush_room {
            (attempt_room, Some("container.artifacts_max_bytes"))
        } else {
            (rush_room, Some("container.rush_artifacts_max_bytes"))
        };
        for t in [
            b.attempts
                .entry((rush.to_string(), lease.to_string()))
                .or_default(),
            b.rushes.entry(rush.to_string()).or_default(),
        ] {
            t.files += 1;
            t.bytes += bytes;
        }
        Ok(Reserved { bytes, cut_by })
    }

    /// Gives back the part of a reservation an artifact did not use.
    pub fn unreserve(&self, rush: &str, lease: &str, unused: u64) {
        let mut b = lock(&self.books);
        if let Some(t) = b.attempts.get_mut(&(rush.to_string(), lease.to_string())) {
            t.bytes = t.bytes.saturating_sub(unused);
        }
        if let Some(t) = b.rushes.get_mut(rush) {
            t.bytes = t.bytes.saturating_sub(unused);
        }
    }

    /// Forgets the counts of a rush that is gone.
    pub fn forget(&self, rush: &str) {
        let mut b = lock(&self.books);
        b.rushes.remove(rush);
        b.attempts.retain(|(r, _), _| r != rush);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> ArtifactCaps {
        ArtifactCaps {
            file_bytes: 100,
            files: 3,
            bytes: 250,
            rush_files: 5,
            rush_bytes: 400,
        }
    }

    #[test]
    fn artifacts_are_counted_per_attempt_and_per_rush() {
        let t = Transfers::new(4, 2);
        let c = caps();
        let r = |lease: &str| t.reserve_artifact("r", lease, &c);
        assert_eq!(r("a#1").unwrap().bytes, 100);
        assert_eq!(r("a#1").unwrap().bytes, 100);
        // The attempt's third file gets what is left of its 250 bytes.
        let third = r("a#1").unwrap();
        assert_eq!(
            (third.bytes, third.cut_by),
            (50, Some("container.artifacts_max_bytes"))
        );
        let e = r("a#1").unwrap_err();
        assert!(e.contains("container.artifacts_max_files"), "{e}");
        // An unused reservation is given back.
        t.unreserve("r", "b#1", 0);
        assert_eq!(r("b#1").unwrap().bytes, 100);
        t.unreserve("r", "b#1", 100);
        // The rush has 400 - 250 bytes left, and two files.
        assert_eq!(r("c#1").unwrap().bytes, 100);
        let e = r("d#1").unwrap_err();
        assert!(e.contains("container.rush_artifacts_max_files"), "{e}");
        t.forget("r");
        assert_eq!(r("d#1").unwrap().bytes, 100);
    }

    #[tokio::test]
    async fn a_new_stream_of_the_same_worker_and_kind_replaces_the_old_one() {
        let t = Transfers::new(2, 1);
        let mut first = t.open("r", 1, Kind::Fetch).await.unwrap();
        let other = t.open("r", 2, Kind::Fetch).await.unwrap();
        assert!(
            first
                .replaced
                .try_recv()
                .is_err_and(|e| e == oneshot::error::TryRecvError::Empty)
        );
        // The plane is full (two places): a third stream of worker 1 cancels its first one,
        // which gives its place back once it ends.
        let second = {
            let t = t.clone();
            tokio::spawn(async move { t.open("r", 1, Kind::Fetch).await })
        };
        (&mut first.replaced).await.unwrap_err();
        drop(first);
        let second = second.await.unwrap().unwrap();
        drop((second, other));
        assert_eq!(t.streams.available_permits(), 2);
        assert!(lock(&t.live).is_empty());
    }
}
