//! Goondan packages, as the original TypeScript Goondan serves and installs
//! them: npm-style gzip tarballs whose entries sit under `package/`.
//!
//! - [`tarball`]: pack a package directory deterministically (the same tree
//!   gives the same bytes), compute and check `sha512-…` integrity, and
//!   unpack a downloaded tarball safely and atomically;
//! - [`version`]: pick the highest published version a range (`^1.2.0`,
//!   `~1.2`, `>=1.0.0 <2`, `1.2.3`) or a dist-tag (`latest`) allows;
//! - [`server`]: the registry's HTTP server (packuments, versions, tarballs,
//!   publish, deprecate, unpublish) over a storage directory, with the
//!   original registry's paths, status codes and JSON;
//! - [`client`]: `gdn package`'s side: the manifest's dependencies, the
//!   lockfile, resolution, installs under the state root, and publishing.
//!
//! The library reads no environment and prints nothing: tokens, the
//! environment lookup and the storage directory come from the caller
//! (`gdn registry serve`, `gdn package`).

pub mod client;
pub mod server;
pub mod tarball;
pub mod version;

/// Whether an I/O error says the disk (or the quota) is full.
pub fn is_disk_full(error: &std::io::Error) -> bool {
    // ENOSPC, EDQUOT (Linux)
    error.kind() == std::io::ErrorKind::StorageFull || matches!(error.raw_os_error(), Some(28 | 122))
}
