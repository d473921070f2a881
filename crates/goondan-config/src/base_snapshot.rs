//! The built-in `@goondan/base` package without parsing and checking its
//! YAML in every process.
//!
//! Every agent process resolves references into the package, so it used to
//! run the loader over `base/goondan.yaml` (37 KB, 23 documents, 37 parameter
//! schemas) at start: ~27 million instructions, most of a bundle load. The
//! text is fixed when the program is built, and so is what the loader makes
//! of it. `base/goondan.snapshot.json` keeps that result: the documents the
//! loader accepted, as JSON, each with its document index and kind. At run
//! time they become resources through the same serde types the loader uses
//! ([`AnyResource::from_value`] deserializes the same `Resource<Spec>`s), so
//! there is still one loader and one meaning of every field; only the YAML
//! parse and the checks, whose outcome is fixed, are skipped.
//!
//! The file is generated, never edited: the unit test
//! `snapshot_is_what_the_loader_makes` runs the loader over the YAML and fails
//! when the file differs (`GOONDAN_BLESS=1 cargo test -p goondan-config --lib
//! base_snapshot` rewrites it). The snapshot also records a hash of the YAML it
//! was made from; when that is not the hash of the YAML compiled in (the YAML
//! was edited and the snapshot not regenerated), or the snapshot cannot be
//! read, the package is loaded from its YAML as before.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use crate::bundle::{Bundle, BundleResource};
use crate::resources::{AnyResource, Kind};

/// The package's YAML, as compiled in.
pub(crate) const BASE_YAML: &str = include_str!("base/goondan.yaml");

/// The loader's result for [`BASE_YAML`] (see the module docs).
const SNAPSHOT: &str = include_str!("base/goondan.snapshot.json");

/// The label of the package's diagnostics.
pub(crate) const BASE_LABEL: &str = "@goondan/base";

/// The path the package reports as its file.
pub(crate) fn base_file() -> PathBuf {
    PathBuf::from("@goondan/base/goondan.yaml")
}

/// FNV-1a (64 bit): a fingerprint of the YAML, computed at compile time.
/// Not a defence against anyone; it only tells a stale snapshot apart.
const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

const BASE_YAML_HASH: u64 = fnv1a64(BASE_YAML.as_bytes());

fn source_tag() -> String {
    format!("fnv1a64:{BASE_YAML_HASH:016x}")
}

/// The package from the snapshot, or `None` when the snapshot is stale or
/// unreadable (the caller then loads the YAML).
pub(crate) fn load() -> Option<Bundle> {
    load_from(SNAPSHOT)
}

fn load_from(snapshot: &str) -> Option<Bundle> {
    let snapshot: Snapshot = serde_json::from_str(snapshot).ok()?;
    if snapshot.source != source_tag() {
        return None;
    }
    Some(Bundle::from_resources(
        std::path::Path::new("."),
        base_file(),
        snapshot.resources.into_iter().map(|entry| entry.0).collect(),
    ))
}

/// `{"source": "fnv1a64:…", "resources": [[doc_index, "Kind", document], …]}`.
#[derive(Deserialize)]
struct Snapshot {
    source: String,
    resources: Vec<Entry>,
}

/// One `[doc_index, "Kind", document]`, deserialized straight into the
/// typed resource (no intermediate `serde_json::Value`).
struct Entry(BundleResource);

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(EntryVisitor)
    }
}

struct EntryVisitor;

impl<'de> Visitor<'de> for EntryVisitor {
    type Value = Entry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[doc_index, kind, document]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
        let doc_index: usize = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let kind: Kind = seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
        let missing = || de::Error::invalid_length(2, &self);
        let resource = match kind {
            Kind::Package => AnyResource::Package(seq.next_element()?.ok_or_else(missing)?),
            Kind::Model => AnyResource::Model(seq.next_element()?.ok_or_else(missing)?),
            Kind::Agent => AnyResource::Agent(seq.next_element()?.ok_or_else(missing)?),
            Kind::Swarm => AnyResource::Swarm(seq.next_element()?.ok_or_else(missing)?),
            Kind::Tool => AnyResource::Tool(seq.next_element()?.ok_or_else(missing)?),
            Kind::Extension => AnyResource::Extension(seq.next_element()?.ok_or_else(missing)?),
            Kind::Connector => AnyResource::Connector(seq.next_element()?.ok_or_else(missing)?),
            Kind::Connection => AnyResource::Connection(seq.next_element()?.ok_or_else(missing)?),
        };
        if seq.next_element::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::invalid_length(4, &self));
        }
        Ok(Entry(BundleResource { doc_index, resource }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::{base_package, load_base_yaml, load_from_str};
    use crate::yaml::parse_documents;

    /// What the snapshot file must hold: the documents the loader accepts
    /// from `yaml`, one per line.
    fn render(yaml: &str) -> String {
        let report = load_from_str(yaml, BASE_LABEL, None, base_file());
        let bundle =
            report.bundle.unwrap_or_else(|| panic!("the base package does not load: {:?}", report.diagnostics));
        let documents = parse_documents(yaml).unwrap_or_else(|e| panic!("{e:?}"));
        let mut out = format!("{{\"source\": {:?},\n\"resources\": [\n", source_tag());
        for (i, entry) in bundle.resources().iter().enumerate() {
            let document = &documents[entry.doc_index].value;
            let line = serde_json::to_string(&serde_json::json!([entry.doc_index, entry.resource.kind(), document]))
                .unwrap_or_else(|e| panic!("{e}"));
            out.push_str(&line);
            out.push_str(if i + 1 == bundle.resources().len() { "\n" } else { ",\n" });
        }
        out.push_str("]}\n");
        out
    }

    #[test]
    fn snapshot_is_what_the_loader_makes() {
        let expected = render(BASE_YAML);
        if std::env::var_os("GOONDAN_BLESS").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/base/goondan.snapshot.json");
            std::fs::write(path, &expected).unwrap_or_else(|e| panic!("{e}"));
            return;
        }
        assert!(
            SNAPSHOT == expected,
            "src/base/goondan.snapshot.json is not what the loader makes of src/base/goondan.yaml; \
             regenerate it with GOONDAN_BLESS=1 cargo test -p goondan-config --lib base_snapshot"
        );
    }

    #[test]
    fn the_snapshot_gives_the_bundle_the_loader_gives() {
        let from_snapshot = load().unwrap_or_else(|| panic!("the snapshot does not load"));
        let from_yaml = load_base_yaml();
        assert_eq!(from_snapshot.root(), from_yaml.root());
        assert_eq!(from_snapshot.file(), from_yaml.file());
        assert_eq!(from_snapshot.package_name(), from_yaml.package_name());
        assert_eq!(from_snapshot.resources(), from_yaml.resources());
        for entry in from_yaml.resources() {
            let (kind, name) = (entry.resource.kind(), entry.resource.name());
            assert_eq!(from_snapshot.get(kind, name), from_yaml.get(kind, name), "{kind:?} {name}");
        }
        // And the process-wide package is the snapshot's.
        assert_eq!(base_package().resources(), from_yaml.resources());
    }

    #[test]
    fn a_stale_or_broken_snapshot_is_not_used() {
        assert_ne!(fnv1a64(b"a"), fnv1a64(b"b"));
        assert_ne!(fnv1a64(format!("{BASE_YAML} ").as_bytes()), BASE_YAML_HASH);
        let stale = SNAPSHOT.replacen(&source_tag(), "fnv1a64:0000000000000000", 1);
        assert_ne!(stale, SNAPSHOT);
        assert!(load_from(&stale).is_none());
        assert!(load_from("{").is_none());
        let wrong_kind = SNAPSHOT.replacen("\"Package\"", "\"Swarm\"", 1);
        assert!(load_from(&wrong_kind).is_none());
    }
}
