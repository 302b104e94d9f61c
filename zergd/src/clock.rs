//! The injectable clock. Deadlines use a monotonic [`Instant`]; persisted and displayed times use
//! wall-clock [`SystemTime`].

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// A source of time.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic now, for deadlines.
    fn now(&self) -> Instant;
    /// Wall-clock now, for timestamps.
    fn wall(&self) -> SystemTime;
}

/// The real clock (tokio's, so paused tokio time in tests also applies).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug)]
pub struct ManualClock {
    inner: Mutex<(Instant, SystemTime)>,
}

impl ManualClock {
    /// A clock starting at the current time.
    pub fn new() -> Self {
        Self {
            inner: Mutex::new((
                Instant::now(),
                SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            )),
        }
    }

    /// Moves both clocks forward.
    pub fn advance(&self, d: Duration) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += d;
        g.1 += d;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).0
    }
    fn wall(&self) -> SystemTime {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

/// Formats a wall-clock time as RFC 3339 UTC with milliseconds (`2026-02-03T05:41:55.123Z`).
pub fn iso_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The wall-clock time for Unix milliseconds.
pub fn from_unix_millis(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}
