//! Replay protection (RFC 9458 §6.5): every request carries a `Date` within
//! [`MAX_DATE_SKEW`] of the gateway's clock, and the encapsulated keys (`enc`) seen while such a
//! request could still be accepted are remembered, so a copy is refused.
//!
//! The window is bounded: at most [`WINDOW_CAPACITY`] keys, and at most a
//! [`PER_CLIENT_SHARE`]th of them from one client (the outer connection, or the API key), so one
//! client cannot fill it for the others. A full window refuses new requests (fail closed)
//! rather than forget keys that could still be replayed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// How far a request's `Date` may be from the gateway's clock, either way.
pub const MAX_DATE_SKEW: Duration = Duration::from_secs(60);

/// How many encapsulated keys the window holds at most.
pub const WINDOW_CAPACITY: usize = 1 << 17;

/// One client may hold at most `WINDOW_CAPACITY / PER_CLIENT_SHARE` entries.
pub const PER_CLIENT_SHARE: usize = 8;

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The encapsulated key was seen before.
    Replayed,
    /// The window (or this client's share of it) is full of keys that can still be replayed.
    Full,
}

/// The `Date` check: `Ok` when `date` (an HTTP date) is within [`MAX_DATE_SKEW`] of `now`.
pub fn check_date(date: Option<&str>, now: SystemTime) -> Result<(), String> {
    let Some(date) = date else {
        return Err(
            "an Oblivious HTTP request must carry a `Date` header (RFC 9458 §6.5)".to_owned(),
        );
    };
    let sent = httpdate::parse_http_date(date)
        .map_err(|_| "the `Date` header is not an HTTP date (RFC 9110 §5.6.7)".to_owned())?;
    let skew = match sent.duration_since(now) {
        Ok(ahead) => ahead,
        Err(behind) => behind.duration(),
    };
    if skew > MAX_DATE_SKEW {
        return Err(format!(
            "the request's `Date` is {}s from the gateway's clock (at most {}s allowed); the response's `Date` is the gateway's",
            skew.as_secs(),
            MAX_DATE_SKEW.as_secs()
        ));
    }
    Ok(())
}

/// The encapsulated keys seen within the window.
pub struct ReplayWindow {
    state: Mutex<State>,
    keep: Duration,
    capacity: usize,
}

#[derive(Default)]
struct State {
    seen: HashSet<[u8; 32]>,
    order: VecDeque<Entry>,
    per_client: HashMap<[u8; 32], usize>,
}

struct Entry {
    key: [u8; 32],
    client: [u8; 32],
    at: Instant,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self::new(WINDOW_CAPACITY, 2 * MAX_DATE_SKEW)
    }
}

impl ReplayWindow {
    /// A window of `capacity` keys, each kept for `keep` (twice the date skew: a request is
    /// accepted while its `Date` is within the skew, at most that long after it first came).
    pub fn new(capacity: usize, keep: Duration) -> Self {
        Self {
            state: Mutex::new(State::default()),
            keep,
            capacity,
        }
    }

    /// Admits the request whose encapsulated key hashes to `key`, from `client`, at `now`.
    pub fn admit(&self, key: [u8; 32], client: [u8; 32], now: Instant) -> Result<(), Refusal> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state
            .order
            .front()
            .is_some_and(|entry| now.saturating_duration_since(entry.at) >= self.keep)
        {
            if let Some(old) = state.order.pop_front() {
                state.seen.remove(&old.key);
                if let Some(count) = state.per_client.get_mut(&old.client) {
                    *count -= 1;
                    if *count == 0 {
                        state.per_client.remove(&old.client);
                    }
                }
            }
        }
        if state.seen.contains(&key) {
            return Err(Refusal::Replayed);
        }
        let share = (self.capacity / PER_CLIENT_SHARE).max(1);
        if state.order.len() >= self.capacity
            || state.per_client.get(&client).copied().unwrap_or(0) >= share
        {
            return Err(Refusal::Full);
        }
        state.seen.insert(key);
        state.order.push_back(Entry {
            key,
            client,
            at: now,
        });
        *state.per_client.entry(client).or_insert(0) += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_admitted_once_within_the_window() {
        let window = ReplayWindow::new(16, Duration::from_secs(120));
        let start = Instant::now();
        window.admit([1; 32], [9; 32], start).unwrap();
        assert_eq!(
            window.admit([1; 32], [8; 32], start + Duration::from_secs(100)),
            Err(Refusal::Replayed),
            "whoever sends the copy"
        );
        window.admit([2; 32], [9; 32], start).unwrap();
        // Past the window the key is forgotten; the date check refuses such a copy instead.
        window
            .admit([1; 32], [9; 32], start + Duration::from_secs(121))
            .unwrap();
    }

    #[test]
    fn the_window_is_bounded_overall_and_per_client() {
        let window = ReplayWindow::new(16, Duration::from_secs(120));
        let now = Instant::now();
        for n in 0..2u8 {
            window.admit([n; 32], [1; 32], now).unwrap();
        }
        assert_eq!(window.admit([50; 32], [1; 32], now), Err(Refusal::Full));
        for n in 0..14u8 {
            let mut client = [0; 32];
            client[0] = n + 2;
            window.admit([n + 100; 32], client, now).unwrap();
        }
        assert_eq!(window.admit([200; 32], [99; 32], now), Err(Refusal::Full));
        let later = now + Duration::from_secs(120);
        window.admit([200; 32], [99; 32], later).unwrap();
    }

    #[test]
    fn the_date_must_be_present_and_close() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = |offset: i64| {
            let at = if offset >= 0 {
                now + Duration::from_secs(offset as u64)
            } else {
                now - Duration::from_secs(offset.unsigned_abs())
            };
            httpdate::fmt_http_date(at)
        };
        assert!(check_date(Some(&date(0)), now).is_ok());
        assert!(check_date(Some(&date(-59)), now).is_ok());
        assert!(check_date(Some(&date(59)), now).is_ok());
        assert!(check_date(Some(&date(-61)), now).is_err());
        assert!(check_date(Some(&date(61)), now).is_err());
        assert!(check_date(None, now).is_err());
        assert!(check_date(Some("yesterday"), now).is_err());
    }
}
