//! What tokens cost: prices in USD per million tokens of each kind, the
//! cost of a [`TokenUsage`] under them, and a default table of list prices
//! for common models.
//!
//! The default table is a snapshot ([`DEFAULT_PRICES_AS_OF`]) of the
//! providers' published standard (not batch, not priority) prices for
//! prompts under the long-context tier; a Model's `spec.pricing` overrides
//! it. A model found in neither has no price: its cost is unknown, never 0.

use crate::types::TokenUsage;

/// Prices in USD per million tokens.
///
/// Reasoning tokens are a part of the output and are billed as output by
/// every provider in the table: `reasoning` is for a model priced
/// otherwise. Cache reads and writes are parts of the prompt; without a
/// price of their own they are charged at the input price.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    /// Prompt tokens not read from or written to the cache.
    pub input: f64,
    /// Generated tokens (reasoning included unless `reasoning` is set).
    pub output: f64,
    /// Prompt tokens read from the cache (default: `input`).
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the cache (default: `input`).
    pub cache_write: Option<f64>,
    /// Reasoning tokens (default: `output`).
    pub reasoning: Option<f64>,
}

impl Prices {
    const fn new(input: f64, output: f64, cache_read: f64, cache_write: Option<f64>) -> Self {
        Self { input, output, cache_read: Some(cache_read), cache_write, reasoning: None }
    }

    /// The cost of `usage` in USD.
    pub fn cost(&self, usage: &TokenUsage) -> f64 {
        // The kinds overlap (see TokenUsage): each token is charged once.
        let uncached =
            usage.input_tokens.saturating_sub(usage.cache_read_tokens).saturating_sub(usage.cache_write_tokens);
        let reasoning = usage.reasoning_tokens.min(usage.output_tokens);
        let answer = usage.output_tokens - reasoning;
        let per_million = uncached as f64 * self.input
            + usage.cache_read_tokens as f64 * self.cache_read.unwrap_or(self.input)
            + usage.cache_write_tokens as f64 * self.cache_write.unwrap_or(self.input)
            + answer as f64 * self.output
            + reasoning as f64 * self.reasoning.unwrap_or(self.output);
        per_million / 1_000_000.0
    }
}

impl From<&goondan_config::ModelPricing> for Prices {
    fn from(pricing: &goondan_config::ModelPricing) -> Self {
        Self {
            input: pricing.input,
            output: pricing.output,
            cache_read: pricing.cache_read,
            cache_write: pricing.cache_write,
            reasoning: pricing.reasoning,
        }
    }
}

/// When the default table's prices were taken from the providers' pages.
pub const DEFAULT_PRICES_AS_OF: &str = "2025-11-30";

/// The default table: a model id (or the start of one, before a `-`
/// suffix such as a snapshot date) and its prices. Anthropic's cache
/// writes are the 5-minute ones (1.25 × input); OpenAI and Gemini charge
/// nothing to write their implicit caches.
pub const DEFAULT_PRICES: &[(&str, Prices)] = &[
    // OpenAI
    ("gpt-5", Prices::new(1.25, 10.0, 0.125, None)),
    ("gpt-5.1", Prices::new(1.25, 10.0, 0.125, None)),
    ("gpt-5-mini", Prices::new(0.25, 2.0, 0.025, None)),
    ("gpt-5-nano", Prices::new(0.05, 0.40, 0.005, None)),
    ("gpt-4.1", Prices::new(2.0, 8.0, 0.50, None)),
    ("gpt-4.1-mini", Prices::new(0.40, 1.60, 0.10, None)),
    ("gpt-4.1-nano", Prices::new(0.10, 0.40, 0.025, None)),
    ("gpt-4o", Prices::new(2.50, 10.0, 1.25, None)),
    ("gpt-4o-mini", Prices::new(0.15, 0.60, 0.075, None)),
    ("o1", Prices::new(15.0, 60.0, 7.50, None)),
    ("o3", Prices::new(2.0, 8.0, 0.50, None)),
    ("o3-mini", Prices::new(1.10, 4.40, 0.55, None)),
    ("o4-mini", Prices::new(1.10, 4.40, 0.275, None)),
    // Anthropic
    ("claude-opus-4", Prices::new(15.0, 75.0, 1.50, Some(18.75))),
    ("claude-opus-4-1", Prices::new(15.0, 75.0, 1.50, Some(18.75))),
    ("claude-opus-4-5", Prices::new(5.0, 25.0, 0.50, Some(6.25))),
    ("claude-sonnet-4", Prices::new(3.0, 15.0, 0.30, Some(3.75))),
    ("claude-sonnet-4-5", Prices::new(3.0, 15.0, 0.30, Some(3.75))),
    ("claude-haiku-4-5", Prices::new(1.0, 5.0, 0.10, Some(1.25))),
    // Google (prompts up to 200 000 tokens)
    ("gemini-2.5-pro", Prices::new(1.25, 10.0, 0.125, None)),
    ("gemini-2.5-flash", Prices::new(0.30, 2.50, 0.03, None)),
    ("gemini-2.5-flash-lite", Prices::new(0.10, 0.40, 0.01, None)),
];

/// The default prices of `model`: the table's longest entry that is the
/// model id or its start followed by `-` (`gpt-4.1-mini-2025-04-14` is
/// `gpt-4.1-mini`, not `gpt-4.1`); a `models/` prefix (Gemini's form) is
/// ignored.
pub fn default_prices(model: &str) -> Option<Prices> {
    let model = model.strip_prefix("models/").unwrap_or(model);
    DEFAULT_PRICES
        .iter()
        .filter(|(id, _)| model == *id || model.strip_prefix(id).is_some_and(|rest| rest.starts_with('-')))
        .max_by_key(|(id, _)| id.len())
        .map(|(_, prices)| *prices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_entry_wins_and_snapshots_match() {
        let input = |model: &str| default_prices(model).map(|p| p.input);
        assert_eq!(input("gpt-4.1-mini-2025-04-14"), Some(0.40));
        assert_eq!(input("gpt-4.1"), Some(2.0));
        assert_eq!(input("gpt-4o-mini"), Some(0.15));
        assert_eq!(input("o3-mini-2025-01-31"), Some(1.10));
        assert_eq!(input("o3"), Some(2.0));
        assert_eq!(input("claude-sonnet-4-5-20250929"), Some(3.0));
        assert_eq!(input("claude-opus-4-5-20251101"), Some(5.0));
        assert_eq!(input("claude-opus-4-20250514"), Some(15.0));
        assert_eq!(input("models/gemini-2.5-flash-lite"), Some(0.10));
        assert_eq!(input("gpt-4.10"), None, "a longer id is another model");
        assert_eq!(input("local-model"), None);
    }

    #[test]
    fn each_token_is_charged_once_at_its_kind_price() {
        let prices = Prices { input: 2.0, output: 8.0, cache_read: Some(0.5), cache_write: Some(4.0), reasoning: None };
        let usage = TokenUsage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 200_000,
            cache_write_tokens: 100_000,
            reasoning_tokens: 300_000,
        };
        // 0.7M × 2 + 0.2M × 0.5 + 0.1M × 4 + 0.5M × 8
        assert!((prices.cost(&usage) - (1.4 + 0.1 + 0.4 + 4.0)).abs() < 1e-9);
        let priced_reasoning = Prices { reasoning: Some(1.0), ..prices };
        assert!((priced_reasoning.cost(&usage) - (1.4 + 0.1 + 0.4 + 1.6 + 0.3)).abs() < 1e-9);
        let unpriced_cache = Prices { cache_read: None, cache_write: None, ..prices };
        assert!((unpriced_cache.cost(&usage) - (2.0 + 4.0)).abs() < 1e-9);
    }
}
