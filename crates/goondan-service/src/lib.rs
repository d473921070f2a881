//! A swarm's service, supervised: the Connections' connectors feeding the
//! inbox and the hub's turns ([`serve`]), the control socket that `gdn
//! restart`, `gdn instance` and `gdn task` reach ([`control`]), the status
//! file ([`status`]), the bundle's watcher ([`watch`]), the signals that
//! stop it ([`shutdown`]), the secrets kept out of every process
//! environment ([`secrets`]), the glue to goondan-nats for a swarm
//! across machines ([`nats`]), and the Swarm's `policy.lifecycle` and
//! `policy.shutdown` ([`lifecycle`]: idle instances expire and are
//! collected).
//!
//! It knows no command line: `gdn` parses the arguments, hands typed
//! options in, prints what [`serve::Report`] and [`serve::Answers`] receive
//! and maps [`serve::ServeError`] and [`serve::Served`] to exit codes.
//!
//! Entry points: [`plan::plan_connections`], then [`serve::serve`];
//! [`control::request`] for a client of a running service.

pub mod control;
pub mod lifecycle;
pub mod nats;
pub mod plan;
pub mod secrets;
pub mod serve;
pub mod shutdown;
pub mod status;
pub mod watch;
