//! The crash policy (the original's): a process that ends with anything but
//! a clean exit is started again by its next message; after more than
//! [`FREE_RESTARTS`] crashes in a row it is started only after a delay that
//! doubles from [`FIRST_DELAY`] up to [`MAX_DELAY`]. A turn answered resets
//! the count.
//!
//! The delays come from `backon`'s exponential backoff with jitter (up to as
//! much again, never past [`MAX_DELAY`]), so that processes that crashed
//! together are not all started again at the same instant.

use std::time::Duration;

use backon::BackoffBuilder as _;

/// Crashes in a row that are restarted at once.
pub const FREE_RESTARTS: u32 = 5;
/// The first delay after that.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// How long to wait before the next start after `crashes` crashes in a row:
/// zero up to [`FREE_RESTARTS`], then from `FIRST_DELAY · 2ⁿ` to twice that
/// (jitter), at most [`MAX_DELAY`].
pub fn delay_after(crashes: u32) -> Duration {
    if crashes <= FREE_RESTARTS {
        return Duration::ZERO;
    }
    // Past 2⁹ s the delay is at the cap anyway.
    let doublings = usize::try_from((crashes - FREE_RESTARTS - 1).min(16)).unwrap_or(16);
    backon::ExponentialBuilder::new()
        .with_jitter()
        .with_factor(2.0)
        .with_min_delay(FIRST_DELAY)
        .with_max_delay(MAX_DELAY)
        .without_max_times()
        .build()
        .nth(doublings)
        .unwrap_or(MAX_DELAY)
        .min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_free_restarts_then_doubling_with_jitter_up_to_five_minutes() {
        assert_eq!(delay_after(0), Duration::ZERO);
        assert_eq!(delay_after(5), Duration::ZERO);
        for _ in 0..20 {
            for (crashes, base) in [(6, 1), (7, 2), (10, 16), (14, 256)] {
                let delay = delay_after(crashes);
                let base = Duration::from_secs(base);
                assert!(delay >= base && delay <= (base * 2).min(MAX_DELAY), "{crashes}: {delay:?}");
            }
            assert_eq!(delay_after(15), MAX_DELAY);
            assert_eq!(delay_after(u32::MAX), MAX_DELAY);
        }
        // Jitter: crashes at the same count do not all wait the same.
        let delays: std::collections::HashSet<Duration> = (0..20).map(|_| delay_after(8)).collect();
        assert!(delays.len() > 1, "{delays:?}");
    }
}
