//! The crash policy (the original's): a process that ends with anything but
//! a clean exit is started again by its next message; after more than
//! [`FREE_RESTARTS`] crashes in a row it is started only after a delay that
//! doubles from [`FIRST_DELAY`] up to [`MAX_DELAY`]. A turn answered resets
//! the count.

use std::time::Duration;

/// Crashes in a row that are restarted at once.
pub const FREE_RESTARTS: u32 = 5;
/// The first delay after that.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// How long to wait before the next start after `crashes` crashes in a row.
pub fn delay_after(crashes: u32) -> Duration {
    if crashes <= FREE_RESTARTS {
        return Duration::ZERO;
    }
    let doublings = (crashes - FREE_RESTARTS - 1).min(16);
    FIRST_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_free_restarts_then_doubling_up_to_five_minutes() {
        assert_eq!(delay_after(0), Duration::ZERO);
        assert_eq!(delay_after(5), Duration::ZERO);
        assert_eq!(delay_after(6), Duration::from_secs(1));
        assert_eq!(delay_after(7), Duration::from_secs(2));
        assert_eq!(delay_after(10), Duration::from_secs(16));
        assert_eq!(delay_after(14), Duration::from_secs(256));
        assert_eq!(delay_after(15), MAX_DELAY);
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }
}
