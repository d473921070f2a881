//! The registry server on 127.0.0.1:0, driven over HTTP as the original's
//! CLI drives its registry: publish (the CLI's payload), packument,
//! version, tarball download checked against its integrity, republish,
//! tokens, deprecate, unpublish, delete, and garbage of every kind.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use goondan_registry::server::{self, RegistryConfig};
use goondan_registry::{tarball, version};
use reqwest::StatusCode;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A status and the body's bytes.
type Answer = (StatusCode, Vec<u8>);

/// A bad request: method, path, content type and body, the status and code expected.
type Garbage<'a> = (&'a str, &'a str, Option<(&'a str, &'a [u8])>, StatusCode, &'a str);

const TOKEN: &str = "test-token";

struct Registry {
    url: String,
    storage: tempfile::TempDir,
    client: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), server::RegistryError>>,
}

impl Registry {
    async fn start() -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(vec![TOKEN.to_owned(), "second-token".to_owned()]).await
    }

    /// A registry that accepts `tokens` (none: read-only).
    async fn start_with(tokens: Vec<String>) -> Result<Self, Box<dyn std::error::Error>> {
        let storage = tempfile::tempdir()?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let mut config = RegistryConfig::new(storage.path(), tokens);
        config.max_body_bytes = 1 << 20;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(server::serve(listener, config, async {
            let _ = stopped.await;
        }));
        // Plain HTTP, but reqwest needs a TLS provider to build a client.
        let tls =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
        let client = reqwest::Client::builder().tls_backend_preconfigured(tls).no_proxy().build()?;
        Ok(Self { url, storage, client, stop: Some(stop), served })
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Answer, Box<dyn std::error::Error>> {
        let url = if path.starts_with("http") { path.to_owned() } else { format!("{}{path}", self.url) };
        let mut request = self.client.request(method, url);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        let response = request.send().await?;
        let status = response.status();
        Ok((status, response.bytes().await?.to_vec()))
    }

    async fn get(&self, path: &str, token: Option<&str>) -> Result<(StatusCode, Value), Box<dyn std::error::Error>> {
        let (status, bytes) = self.send(reqwest::Method::GET, path, token, None).await?;
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    async fn put_json(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> Result<(StatusCode, Value), Box<dyn std::error::Error>> {
        let body = Some(("application/json", serde_json::to_vec(body)?));
        let (status, bytes) = self.send(reqwest::Method::PUT, path, token, body).await?;
        Ok((status, serde_json::from_slice(&bytes)?))
    }

    async fn stop(mut self) -> TestResult {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.served).await??;
        Ok(())
    }
}

/// The payload the original CLI's `gdn package publish` sends.
fn publish_payload(name: &str, version: &str, tarball: &[u8], access: &str, tag: Option<&str>) -> Value {
    let short = name.rsplit('/').next().unwrap_or(name);
    let mut payload = json!({
        "name": name,
        "version": version,
        "access": access,
        "dependencies": {"@goondan/core-utils": "^0.5.0"},
        "_attachments": {
            format!("{short}-{version}.tgz"): {
                "data": base64::engine::general_purpose::STANDARD.encode(tarball),
                "contentType": "application/gzip",
                "length": tarball.len(),
            }
        }
    });
    if let Some(tag) = tag {
        payload["dist-tags"] = json!({ tag: version });
    }
    payload
}

fn package_tarball(dir: &Path, version: &str) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    std::fs::write(dir.join("goondan.yaml"), format!("kind: Package\nspec:\n  version: {version}\n"))?;
    Ok(tarball::pack(dir, &tarball::PackOptions::default())?)
}

fn code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn publish_read_download_deprecate_unpublish() -> TestResult {
    let registry = Registry::start().await?;
    let source = tempfile::tempdir()?;
    let v100 = package_tarball(source.path(), "1.0.0")?;

    // As the CLI sends it: the scope encoded (`%40goondan/base`).
    let (status, body) = registry
        .put_json(
            "/%40goondan/base",
            Some(TOKEN),
            &publish_payload("@goondan/base", "1.0.0", &v100, "public", Some("latest")),
        )
        .await?;
    assert_eq!((status, &body), (StatusCode::CREATED, &json!({"ok": true, "id": "@goondan/base", "version": "1.0.0"})));

    let (status, packument) = registry.get("/@goondan/base", None).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(packument["name"], "@goondan/base");
    assert_eq!(packument["access"], "public");
    assert_eq!(packument["description"], "");
    assert_eq!(packument["dist-tags"], json!({"latest": "1.0.0"}));
    let dist = &packument["versions"]["1.0.0"]["dist"];
    assert_eq!(dist["integrity"], tarball::integrity(&v100));
    assert_eq!(dist["shasum"].as_str().map(str::len), Some(40));
    let tarball_url = dist["tarball"].as_str().ok_or("no tarball URL")?;
    assert_eq!(tarball_url, format!("{}/%40goondan/base/-/base-1.0.0.tgz", registry.url));
    assert_eq!(packument["versions"]["1.0.0"]["dependencies"], json!({"@goondan/core-utils": "^0.5.0"}));
    assert_eq!(packument["versions"]["1.0.0"]["deprecated"], "");
    // The name as one encoded segment, as npm clients send it.
    assert_eq!(registry.get("/@goondan%2fbase", None).await?, (StatusCode::OK, packument.clone()));

    let (status, found) = registry.get("/@goondan/base/1.0.0", None).await?;
    assert_eq!((status, &found["version"]), (StatusCode::OK, &json!("1.0.0")));
    assert_eq!(found, packument["versions"]["1.0.0"]);

    // Download and check as an install does, then unpack.
    let (status, bytes) = registry.send(reqwest::Method::GET, tarball_url, None, None).await?;
    assert_eq!(status, StatusCode::OK);
    let integrity = dist["integrity"].as_str().ok_or("no integrity")?;
    tarball::verify_integrity(&bytes, integrity)?;
    let installed = tempfile::tempdir()?;
    tarball::unpack(&bytes, integrity, &installed.path().join("base"))?;
    assert!(std::fs::read_to_string(installed.path().join("base/goondan.yaml"))?.contains("1.0.0"));

    // A version is published once.
    let again = publish_payload("@goondan/base", "1.0.0", &v100, "public", Some("latest"));
    let (status, body) = registry.put_json("/@goondan/base", Some(TOKEN), &again).await?;
    assert_eq!((status, code(&body)), (StatusCode::CONFLICT, "PKG_VERSION_EXISTS"));

    // No dist-tags: `latest` moves to a higher version; a tag leaves it.
    let v110 = package_tarball(source.path(), "1.1.0")?;
    let (status, _) = registry
        .put_json("/@goondan/base", Some(TOKEN), &publish_payload("@goondan/base", "1.1.0", &v110, "public", None))
        .await?;
    assert_eq!(status, StatusCode::CREATED);
    let v2 = package_tarball(source.path(), "2.0.0-beta.1")?;
    let beta = publish_payload("@goondan/base", "2.0.0-beta.1", &v2, "public", Some("beta"));
    assert_eq!(registry.put_json("/@goondan/base", Some("second-token"), &beta).await?.0, StatusCode::CREATED);
    let (_, packument) = registry.get("/@goondan/base", None).await?;
    assert_eq!(packument["dist-tags"], json!({"latest": "1.1.0", "beta": "2.0.0-beta.1"}));
    let published: Vec<&str> =
        packument["versions"].as_object().ok_or("no versions")?.keys().map(String::as_str).collect();
    let tags: BTreeMap<String, String> = serde_json::from_value(packument["dist-tags"].clone())?;
    assert_eq!(version::resolve(published.iter().copied(), &tags, "^1.0.0")?.to_string(), "1.1.0");
    assert_eq!(version::resolve(published.iter().copied(), &tags, "beta")?.to_string(), "2.0.0-beta.1");

    // Deprecate, then undo it with an empty message.
    let (status, body) =
        registry.put_json("/@goondan/base/1.0.0/deprecate", Some(TOKEN), &json!({"message": "Use 1.1.0"})).await?;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({"ok": true, "id": "@goondan/base", "version": "1.0.0", "deprecated": "Use 1.1.0"}))
    );
    assert_eq!(registry.get("/@goondan/base/1.0.0", None).await?.1["deprecated"], "Use 1.1.0");
    let (status, body) = registry.put_json("/@goondan/base/1.0.0/deprecate", Some(TOKEN), &json!({})).await?;
    assert_eq!((status, code(&body)), (StatusCode::BAD_REQUEST, "PKG_INVALID_DEPRECATE_PAYLOAD"));
    let (status, body) =
        registry.put_json("/@goondan/base/9.9.9/deprecate", Some(TOKEN), &json!({"message": "x"})).await?;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "PKG_VERSION_NOT_FOUND"));
    registry.put_json("/@goondan/base/1.0.0/deprecate", Some(TOKEN), &json!({"message": ""})).await?;
    assert_eq!(registry.get("/@goondan/base/1.0.0", None).await?.1["deprecated"], "");

    // Unpublish 1.1.0: its tag goes, `latest` falls to the highest left.
    let (status, body) = registry.send(reqwest::Method::DELETE, "/@goondan/base/1.1.0", Some(TOKEN), None).await?;
    assert_eq!(
        (status, serde_json::from_slice::<Value>(&body)?),
        (StatusCode::OK, json!({"ok": true, "removed": "1.1.0"}))
    );
    let (status, body) = registry.get("/@goondan/base/1.1.0", None).await?;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "PKG_VERSION_NOT_FOUND"));
    let (status, body) = registry.get("/@goondan/base/-/base-1.1.0.tgz", None).await?;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "PKG_VERSION_NOT_FOUND"));
    assert_eq!(
        registry.get("/@goondan/base", None).await?.1["dist-tags"],
        json!({"latest": "2.0.0-beta.1", "beta": "2.0.0-beta.1"})
    );

    // The storage is the original's layout, with no temporary file left.
    let dir = registry.storage.path().join("packages/%40goondan/base");
    assert!(dir.join("metadata.json").is_file() && dir.join("tarballs/1.0.0.tgz").is_file());
    assert!(!dir.join("tarballs/1.1.0.tgz").exists());
    let mut names: Vec<String> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    assert_eq!(names, ["metadata.json", "tarballs"]);

    // The whole package.
    let (status, body) = registry.send(reqwest::Method::DELETE, "/@goondan/base", Some(TOKEN), None).await?;
    assert_eq!(
        (status, serde_json::from_slice::<Value>(&body)?),
        (StatusCode::OK, json!({"ok": true, "id": "@goondan/base"}))
    );
    let (status, body) = registry.get("/@goondan/base", None).await?;
    assert_eq!((status, code(&body)), (StatusCode::NOT_FOUND, "PKG_NOT_FOUND"));
    assert!(!dir.exists());
    let (status, body) = registry.send(reqwest::Method::DELETE, "/@goondan/base", Some(TOKEN), None).await?;
    assert_eq!((status, code(&serde_json::from_slice(&body)?)), (StatusCode::NOT_FOUND, "PKG_NOT_FOUND"));

    // Unpublishing the last version removes the package.
    registry
        .put_json("/@goondan/solo", Some(TOKEN), &publish_payload("@goondan/solo", "0.1.0", &v100, "public", None))
        .await?;
    assert_eq!(
        registry.send(reqwest::Method::DELETE, "/@goondan/solo/0.1.0", Some(TOKEN), None).await?.0,
        StatusCode::OK
    );
    assert_eq!(registry.get("/@goondan/solo", None).await?.0, StatusCode::NOT_FOUND);
    registry.stop().await
}

#[tokio::test]
async fn tokens_are_required_where_the_original_requires_them() -> TestResult {
    let registry = Registry::start().await?;
    let bytes = b"registry test tarball".to_vec();
    let payload = publish_payload("@goondan/base", "1.0.0", &bytes, "public", Some("latest"));
    // No token, a wrong one, a malformed header: 401, as the original answers.
    for token in [None, Some("invalid"), Some("")] {
        let (status, body) = registry.put_json("/@goondan/base", token, &payload).await?;
        assert_eq!((status, code(&body)), (StatusCode::UNAUTHORIZED, "PKG_AUTH_REQUIRED"), "{token:?}");
    }
    assert_eq!(registry.get("/@goondan/base", None).await?.0, StatusCode::NOT_FOUND, "nothing was published");
    assert_eq!(registry.put_json("/@goondan/base", Some(TOKEN), &payload).await?.0, StatusCode::CREATED);
    for (method, path) in [
        (reqwest::Method::DELETE, "/@goondan/base"),
        (reqwest::Method::DELETE, "/@goondan/base/1.0.0"),
        (reqwest::Method::PUT, "/@goondan/base/1.0.0/deprecate"),
    ] {
        let body = Some(("application/json", br#"{"message":"x"}"#.to_vec()));
        let (status, _) = registry.send(method.clone(), path, Some("wrong"), body).await?;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }

    // A restricted package is read with the token only.
    let secret = publish_payload("@goondan/secret", "2.0.0", &bytes, "restricted", Some("latest"));
    assert_eq!(registry.put_json("/@goondan/secret", Some(TOKEN), &secret).await?.0, StatusCode::CREATED);
    assert_eq!(registry.get("/@goondan/secret", None).await?.0, StatusCode::UNAUTHORIZED);
    assert_eq!(registry.get("/@goondan/secret", Some("wrong")).await?.0, StatusCode::UNAUTHORIZED);
    assert_eq!(registry.get("/@goondan/secret", Some(TOKEN)).await?.0, StatusCode::OK);
    assert_eq!(registry.get("/@goondan/secret/2.0.0", None).await?.0, StatusCode::UNAUTHORIZED);
    let tarball = "/@goondan/secret/-/secret-2.0.0.tgz";
    assert_eq!(registry.send(reqwest::Method::GET, tarball, None, None).await?.0, StatusCode::UNAUTHORIZED);
    assert_eq!(registry.send(reqwest::Method::GET, tarball, Some(TOKEN), None).await?, (StatusCode::OK, bytes));
    registry.stop().await
}

#[tokio::test]
async fn garbage_gets_structured_errors() -> TestResult {
    let registry = Registry::start().await?;
    const JSON: &str = "application/json";
    let too_large = vec![b' '; 2 << 20];
    let cases: &[Garbage<'_>] = &[
        (
            "PUT",
            "/@goondan/base",
            Some(("text/plain", b"{}")),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "PKG_UNSUPPORTED_MEDIA_TYPE",
        ),
        ("PUT", "/@goondan/base", Some((JSON, b"")), StatusCode::BAD_REQUEST, "PKG_EMPTY_REQUEST_BODY"),
        ("PUT", "/@goondan/base", Some((JSON, b"{not json")), StatusCode::BAD_REQUEST, "PKG_INVALID_JSON"),
        ("PUT", "/@goondan/base", Some((JSON, b"[1, 2]")), StatusCode::BAD_REQUEST, "PKG_INVALID_PUBLISH_PAYLOAD"),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"access":"everyone"}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_PUBLISH_PAYLOAD",
        ),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"version":"one"}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_VERSION",
        ),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"name":"@goondan/base"}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_VERSION",
        ),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"name":"@goondan/other","version":"1.0.0"}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_NAME_MISMATCH",
        ),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"version":"1.0.0"}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_ATTACHMENT",
        ),
        (
            "PUT",
            "/@goondan/base",
            Some((JSON, br#"{"version":"1.0.0","_attachments":{"a.tgz":{"data":"!!not base64!!"}}}"#)),
            StatusCode::BAD_REQUEST,
            "PKG_INVALID_ATTACHMENT",
        ),
        ("PUT", "/@goondan/base", Some((JSON, &too_large)), StatusCode::PAYLOAD_TOO_LARGE, "PKG_PAYLOAD_TOO_LARGE"),
        ("GET", "/unknown", None, StatusCode::NOT_FOUND, "PKG_NOT_FOUND"),
        ("GET", "/goondan/base", None, StatusCode::NOT_FOUND, "PKG_NOT_FOUND"),
        ("GET", "/@goondan/%ff%fe", None, StatusCode::NOT_FOUND, "PKG_NOT_FOUND"),
        ("GET", "/@goondan/.hidden", None, StatusCode::BAD_REQUEST, "PKG_INVALID_NAME"),
        ("GET", "/@Goondan/Base", None, StatusCode::BAD_REQUEST, "PKG_INVALID_NAME"),
        ("POST", "/@goondan/base", None, StatusCode::METHOD_NOT_ALLOWED, "PKG_METHOD_NOT_ALLOWED"),
        ("DELETE", "/@goondan/base/-/base-1.0.0.tgz", None, StatusCode::METHOD_NOT_ALLOWED, "PKG_METHOD_NOT_ALLOWED"),
    ];
    for (method, path, body, status, error) in cases {
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let body = body.map(|(kind, bytes)| (kind, bytes.to_vec()));
        let (got, bytes) = registry.send(method, path, Some(TOKEN), body).await?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{error}: not JSON: {e}"))?;
        assert_eq!((got, code(&body)), (*status, *error), "{path}: {body}");
        assert!(body["message"].is_string(), "{body}");
    }
    assert!(!registry.storage.path().join("packages").exists(), "nothing written");
    registry.stop().await
}

#[tokio::test]
async fn concurrent_publishes_of_one_package_all_land() -> TestResult {
    let registry = std::sync::Arc::new(Registry::start().await?);
    let tasks: Vec<_> = (0..8)
        .map(|minor| {
            let registry = std::sync::Arc::clone(&registry);
            tokio::spawn(async move {
                let version = format!("1.{minor}.0");
                let payload = publish_payload("@goondan/busy", &version, version.as_bytes(), "public", None);
                registry.put_json("/@goondan/busy", Some(TOKEN), &payload).await.map(|r| r.0).map_err(|e| e.to_string())
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await??, StatusCode::CREATED);
    }
    let (_, packument) = registry.get("/@goondan/busy", None).await?;
    assert_eq!(packument["versions"].as_object().map(serde_json::Map::len), Some(8));
    assert_eq!(packument["dist-tags"]["latest"], "1.7.0");
    let registry = std::sync::Arc::into_inner(registry).ok_or("registry still shared")?;
    registry.stop().await
}

/// A storage directory the original registry wrote (its layout, its
/// `JSON.stringify(metadata, null, 2)`) is served as it is.
#[tokio::test]
async fn serves_a_storage_the_original_wrote() -> TestResult {
    let registry = Registry::start().await?;
    let tarball = b"original tarball".to_vec();
    let metadata = json!({
        "name": "@goondan/old",
        "description": "written by the TypeScript registry",
        "access": "public",
        "versions": {
            "0.9.0": {
                "version": "0.9.0",
                "dependencies": {},
                "deprecated": "",
                "access": "public",
                "dist": {
                    "tarball": "https://registry.example/%40goondan/old/-/old-0.9.0.tgz",
                    "shasum": "0000000000000000000000000000000000000000",
                    "integrity": tarball::integrity(&tarball),
                },
            }
        },
        "dist-tags": {"latest": "0.9.0"},
    });
    let dir = registry.storage.path().join("packages/%40goondan/old");
    std::fs::create_dir_all(dir.join("tarballs"))?;
    std::fs::write(dir.join("metadata.json"), serde_json::to_string_pretty(&metadata)?)?;
    std::fs::write(dir.join("tarballs/0.9.0.tgz"), &tarball)?;

    assert_eq!(registry.get("/@goondan/old", None).await?, (StatusCode::OK, metadata));
    let (status, bytes) = registry.send(reqwest::Method::GET, "/@goondan/old/-/old-0.9.0.tgz", None, None).await?;
    assert_eq!((status, bytes), (StatusCode::OK, tarball));

    // A packument that is not one: a structured 500, not a crash.
    std::fs::write(dir.join("metadata.json"), "{\"name\": 1}")?;
    let (status, body) = registry.get("/@goondan/old", None).await?;
    assert_eq!((status, code(&body)), (StatusCode::INTERNAL_SERVER_ERROR, "PKG_STORAGE_ERROR"));
    registry.stop().await
}

/// The original registry routes scoped names only (`parseScopedPackageName`):
/// an unscoped name is no route, for every method and with a token too —
/// 404 `PKG_NOT_FOUND` before any check of the token, nothing written. The
/// name as one encoded segment (`@scope%2fname`, which npm clients send
/// and the original does not route) works for every route here.
#[tokio::test]
async fn unscoped_names_are_no_route_and_the_encoded_scoped_name_is_every_route() -> TestResult {
    let registry = Registry::start().await?;
    let bytes = b"an unscoped try".to_vec();
    for (method, path) in [
        (reqwest::Method::GET, "/base"),
        (reqwest::Method::PUT, "/base"),
        (reqwest::Method::DELETE, "/base"),
        (reqwest::Method::GET, "/base/1.0.0"),
        (reqwest::Method::DELETE, "/base/1.0.0"),
        (reqwest::Method::GET, "/base/-/base-1.0.0.tgz"),
        (reqwest::Method::PUT, "/base/1.0.0/deprecate"),
        (reqwest::Method::GET, "/%40goondan"),
        (reqwest::Method::GET, "/@goondan/base%2fextra"),
    ] {
        for token in [None, Some(TOKEN)] {
            let payload = publish_payload("base", "1.0.0", &bytes, "public", None);
            let body = Some(("application/json", serde_json::to_vec(&payload)?));
            let (status, answer) = registry.send(method.clone(), path, token, body).await?;
            let answer: Value = serde_json::from_slice(&answer)?;
            assert_eq!((status, code(&answer)), (StatusCode::NOT_FOUND, "PKG_NOT_FOUND"), "{method} {path} {token:?}");
            assert_eq!(answer["message"], "Package route not found", "{method} {path}");
        }
    }
    assert!(!registry.storage.path().join("packages").exists(), "nothing written");

    // Every route through `@goondan%2Fbase`: publish, read, download, deprecate, unpublish, delete.
    let payload = publish_payload("@goondan/base", "1.0.0", &bytes, "public", None);
    assert_eq!(registry.put_json("/@goondan%2Fbase", Some(TOKEN), &payload).await?.0, StatusCode::CREATED);
    let payload = publish_payload("@goondan/base", "1.1.0", &bytes, "public", None);
    assert_eq!(registry.put_json("/%40goondan%2fbase", Some(TOKEN), &payload).await?.0, StatusCode::CREATED);
    assert_eq!(registry.get("/@goondan%2fbase/1.0.0", None).await?.1["version"], "1.0.0");
    let tarball = registry.send(reqwest::Method::GET, "/@goondan%2fbase/-/base-1.0.0.tgz", None, None).await?;
    assert_eq!(tarball, (StatusCode::OK, bytes.clone()));
    let deprecated =
        registry.put_json("/@goondan%2fbase/1.0.0/deprecate", Some(TOKEN), &json!({"message": "old"})).await?;
    assert_eq!(deprecated.1["id"], "@goondan/base");
    assert_eq!(registry.get("/@goondan/base/1.0.0", None).await?.1["deprecated"], "old");
    let removed = registry.send(reqwest::Method::DELETE, "/@goondan%2fbase/1.1.0", Some(TOKEN), None).await?;
    assert_eq!(removed.0, StatusCode::OK);
    assert_eq!(registry.get("/@goondan/base", None).await?.1["dist-tags"], json!({"latest": "1.0.0"}));
    let deleted = registry.send(reqwest::Method::DELETE, "/@goondan%2fbase", Some(TOKEN), None).await?;
    assert_eq!(deleted.0, StatusCode::OK);
    assert_eq!(registry.get("/@goondan/base", None).await?.0, StatusCode::NOT_FOUND);
    registry.stop().await
}

/// The original answers 401 `PKG_AUTH_REQUIRED` (never 403) to a change
/// without a valid token, also on a registry that has no token at all
/// (read-only): nothing can change it.
#[tokio::test]
async fn a_registry_without_tokens_is_read_only_with_401() -> TestResult {
    let registry = Registry::start_with(Vec::new()).await?;
    let payload = serde_json::to_vec(&publish_payload("@goondan/base", "1.0.0", b"x", "public", None))?;
    for (method, path) in [
        (reqwest::Method::PUT, "/@goondan/base"),
        (reqwest::Method::DELETE, "/@goondan/base"),
        (reqwest::Method::DELETE, "/@goondan/base/1.0.0"),
        (reqwest::Method::PUT, "/@goondan/base/1.0.0/deprecate"),
    ] {
        for token in [None, Some(""), Some("anything"), Some(TOKEN)] {
            let body = Some(("application/json", payload.clone()));
            let (status, answer) = registry.send(method.clone(), path, token, body).await?;
            let answer: Value = serde_json::from_slice(&answer)?;
            assert_eq!((status, code(&answer)), (StatusCode::UNAUTHORIZED, "PKG_AUTH_REQUIRED"), "{method} {path}");
        }
    }
    assert!(!registry.storage.path().join("packages").exists());
    registry.stop().await
}

/// `latest` moves only to a version of higher precedence, as the original's
/// `compareSemver` orders them: build metadata does not count (`1.0.0+b`
/// is not newer than `1.0.0+a`), and an unpublish that removes `latest`
/// falls back to the highest by precedence.
#[tokio::test]
async fn latest_follows_precedence_without_build_metadata() -> TestResult {
    let registry = Registry::start().await?;
    for version in ["1.0.0+a", "1.0.0+b", "0.9.0"] {
        let payload = publish_payload("@goondan/built", version, version.as_bytes(), "public", None);
        assert_eq!(registry.put_json("/@goondan/built", Some(TOKEN), &payload).await?.0, StatusCode::CREATED);
    }
    assert_eq!(registry.get("/@goondan/built", None).await?.1["dist-tags"], json!({"latest": "1.0.0+a"}));
    let removed = registry.send(reqwest::Method::DELETE, "/@goondan/built/1.0.0+a", Some(TOKEN), None).await?;
    assert_eq!(removed.0, StatusCode::OK);
    assert_eq!(registry.get("/@goondan/built", None).await?.1["dist-tags"], json!({"latest": "1.0.0+b"}));
    registry.stop().await
}
