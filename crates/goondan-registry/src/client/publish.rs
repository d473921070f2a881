//! `gdn package publish`: the bundle directory packed (the `files` list of
//! its `package.json` when there is one, else what `.goondanignore` /
//! `.npmignore` leaves; never `.env*`, `.git`, `node_modules` or the state
//! root) and sent as the original's payload, `PUT /<name>` with `name`,
//! `version`, `access`, `dependencies`, `dist-tags`, `versions` (npm's
//! shape) and the tarball in `_attachments`, with the bearer token.
//! The caller validates the bundle first.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};

use super::manifest::Manifest;
use super::{Http, PackageError, Settings, check_name};
use crate::tarball::{self, PackOptions};

/// What `publish` is asked.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// The dist-tag to point at the version (`latest`).
    pub tag: String,
    /// `public` or `restricted`; `None` takes `spec.access`, else public.
    pub access: Option<String>,
    /// Build and show the payload, send nothing.
    pub dry_run: bool,
}

/// What was (or, dry, would be) published.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Published {
    pub name: String,
    pub version: String,
    pub tag: String,
    pub access: String,
    pub registry: String,
    pub dry_run: bool,
    pub files: Vec<String>,
    pub integrity: String,
    pub size: usize,
    /// The payload, the tarball's base64 left out.
    pub payload: Value,
}

/// The tarball's attachment name: `<name without scope>-<version>.tgz`.
fn attachment_name(name: &str, version: &str) -> String {
    let bare = name.rsplit('/').next().unwrap_or(name);
    format!("{bare}-{version}.tgz")
}

/// `package.json`'s `files`, when it has a list of strings.
fn files_list(dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("package.json")).ok()?;
    let value: Value = serde_json::from_str(&text).ok()?;
    value.get("files")?.as_array()?.iter().map(|f| f.as_str().map(str::to_owned)).collect()
}

/// Packs the bundle of `manifest_path` and publishes it.
pub async fn publish(
    settings: &Settings<'_>,
    manifest_path: &Path,
    options: &PublishOptions,
) -> Result<Published, PackageError> {
    let manifest = Manifest::read(manifest_path)?;
    let meta = manifest.package()?;
    let missing = |what: &str| PackageError::Manifest {
        path: manifest_path.to_path_buf(),
        message: format!("the Package document has no {what}"),
    };
    let name = meta.name.clone().ok_or_else(|| missing("metadata.name"))?;
    check_name(&name)?;
    let version = meta.version.clone().ok_or_else(|| missing("spec.version"))?;
    if let Err(error) = semver::Version::parse(&version) {
        return Err(PackageError::InvalidVersion { name, version, reason: error.to_string() });
    }
    let access = options.access.clone().or(meta.access.clone()).unwrap_or_else(|| "public".to_owned());
    if access != "public" && access != "restricted" {
        return Err(PackageError::Manifest {
            path: manifest_path.to_path_buf(),
            message: format!("access {access:?} is neither public nor restricted"),
        });
    }
    let dir = manifest_path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let pack_options = PackOptions { files: files_list(dir), exclude: vec![settings.state_root.clone()] };
    let pack_error = |source| PackageError::Tarball { name: name.clone(), version: version.clone(), source };
    let files = tarball::packed_paths(dir, &pack_options).map_err(pack_error)?;
    if !files.iter().any(|f| f == "goondan.yaml" || f == "dist/goondan.yaml") {
        return Err(PackageError::NoManifestInTarball { name, version });
    }
    let bytes = tarball::pack(dir, &pack_options).map_err(pack_error)?;
    let integrity = tarball::integrity(&bytes);
    let dependencies: serde_json::Map<String, Value> =
        meta.dependencies.iter().map(|d| (d.name.clone(), Value::String(d.range.clone()))).collect();
    let attachment = attachment_name(&name, &version);
    let mut payload = json!({
        "name": name,
        "version": version,
        "access": access,
        "dependencies": dependencies,
        "dist-tags": { options.tag.as_str(): version },
        "versions": { version.as_str(): { "name": name, "version": version, "dependencies": dependencies } },
        "_attachments": { attachment.as_str(): {
            "data": base64::engine::general_purpose::STANDARD.encode(&bytes),
            "contentType": "application/gzip",
            "length": bytes.len(),
        } },
    });
    let registry = settings.registry_url(&name);
    if !options.dry_run {
        let token = settings.token(&registry);
        Http::new(settings)?.publish(&registry, &name, &payload, token.as_deref()).await?;
    }
    if let Some(data) = payload.pointer_mut(&format!("/_attachments/{}/data", attachment.replace('~', "~0"))) {
        *data = Value::String(format!("<{} bytes of base64>", data.as_str().map_or(0, str::len)));
    }
    Ok(Published {
        name,
        version,
        tag: options.tag.clone(),
        access,
        registry,
        dry_run: options.dry_run,
        files,
        integrity,
        size: bytes.len(),
        payload,
    })
}
