//! Telling systemd how zergd is doing (`Type=notify`): `READY=1` once the control socket
//! answers, and `WATCHDOG=1` pings from the supervisor's own loop, so that a wedged actor stops
//! the pings and systemd restarts zergd (`WatchdogSec=`). Outside systemd (no `NOTIFY_SOCKET`)
//! every call here does nothing.

use std::time::Duration;

use tokio::time::Instant;

/// Tells the service manager that zergd is ready: its control socket is bound and served.
pub fn ready() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "cannot tell the service manager zergd is ready");
    }
}

/// Tells the service manager that zergd is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}

/// The watchdog pings of the supervisor loop: at half the interval systemd asked for.
#[derive(Debug)]
pub struct Watchdog {
    every: Option<Duration>,
    next: Instant,
}

impl Watchdog {
    /// The watchdog systemd asked for (`WATCHDOG_USEC`, for this process), or one that never
    /// pings.
    pub fn from_env(now: Instant) -> Self {
        let var = |k| std::env::var(k).ok();
        let every = watchdog_interval(
            var("WATCHDOG_USEC").as_deref(),
            var("WATCHDOG_PID").as_deref(),
            std::process::id(),
        );
        Self::every(every, now)
    }

    /// A watchdog that pings every `every` (`None`: never).
    pub fn every(every: Option<Duration>, now: Instant) -> Self {
        Self { every, next: now }
    }

    /// When the next ping is due, if pings are wanted.
    pub fn due(&self) -> Option<Instant> {
        self.every.map(|_| self.next)
    }

    /// Pings if a ping is due; returns whether it did.
    pub fn ping_if_due(&mut self, now: Instant) -> bool {
        let Some(every) = self.every else {
            return false;
        };
        if now < self.next {
            return false;
        }
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
        self.next = now + every;
        true
    }
}

/// How often to ping for `WATCHDOG_USEC` and `WATCHDOG_PID`, as `sd_watchdog_enabled(3)` reads
/// them: the interval is half the one asked for; a `WATCHDOG_PID` that is set must be this
/// process, and one that is unset means this process (systemd sets it, other service managers
/// and `systemd-run` wrappers may not).
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok()?;
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec) / 2).filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_at_the_interval_and_never_without_one() {
        let t0 = Instant::now();
        let mut w = Watchdog::every(Some(Duration::from_secs(10)), t0);
        assert!(w.ping_if_due(t0));
        assert!(!w.ping_if_due(t0 + Duration::from_secs(9)));
        assert_eq!(w.due(), Some(t0 + Duration::from_secs(10)));
        assert!(w.ping_if_due(t0 + Duration::from_secs(10)));
        let mut none = Watchdog::every(None, t0);
        assert_eq!(none.due(), None);
        assert!(!none.ping_if_due(t0 + Duration::from_secs(3600)));
    }

    #[test]
    fn the_watchdog_is_read_as_sd_watchdog_enabled_reads_it() {
        let half = Some(Duration::from_millis(200));
        assert_eq!(watchdog_interval(Some("400000"), None, 7), half);
        assert_eq!(watchdog_interval(Some("400000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval(Some("400000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
    }
}
