use super::*;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn write(root: &Path, relative: &str, content: &str) -> TestResult {
    let path = root.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, content)?;
    Ok(())
}

/// A package tree with things that must never be packed.
fn package() -> Result<tempfile::TempDir, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    write(root, "goondan.yaml", "kind: Package\n")?;
    write(root, "README.md", "# pkg\n")?;
    write(root, "dist/tools/a.js", "export const a = 1;\n")?;
    write(root, "dist/tools/b.ts", "export const b = 2;\n")?;
    write(root, "src/index.ts", "source\n")?;
    write(root, ".env", "KEY=secret\n")?;
    write(root, "dist/.env.local", "KEY=secret\n")?;
    write(root, ".git/config", "[core]\n")?;
    write(root, "node_modules/dep/index.js", "dep\n")?;
    write(root, "state/workspaces/x.json", "{}\n")?;
    Ok(dir)
}

fn options(files: Option<&[&str]>) -> PackOptions {
    PackOptions {
        files: files.map(|files| files.iter().map(|f| (*f).to_owned()).collect()),
        exclude: vec![PathBuf::from("state")],
    }
}

/// A gzip tarball built entry by entry with the `tar` crate.
fn archive(
    build: impl FnOnce(&mut tar::Builder<Vec<u8>>) -> std::io::Result<()>,
) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut builder = tar::Builder::new(Vec::new());
    build(&mut builder)?;
    let tar = builder.into_inner()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar)?;
    Ok(gz.finish()?)
}

fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, content: &[u8]) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    // `set_path` refuses `..` and absolute paths: write the raw name.
    let name = &mut header.as_old_mut().name;
    name.fill(0);
    name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_cksum();
    builder.append(&header, content)
}

fn link(builder: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(0);
    header.set_mode(0o777);
    header.set_entry_type(kind);
    header.set_path(path)?;
    let linkname = &mut header.as_old_mut().linkname;
    linkname.fill(0);
    linkname[..target.len()].copy_from_slice(target.as_bytes());
    header.set_cksum();
    builder.append(&header, std::io::empty())
}

fn refused(bytes: &[u8]) -> Option<(String, UnsafeReason)> {
    let dest = tempfile::tempdir().ok()?;
    match unpack(bytes, &integrity(bytes), &dest.path().join("pkg")) {
        Err(TarballError::UnsafeEntry { entry, reason }) => {
            assert!(!dest.path().join("pkg").exists(), "nothing is left in place after a refusal");
            Some((entry, reason))
        }
        other => panic!("expected a refused entry, got {other:?}"),
    }
}

#[test]
fn packs_under_package_and_never_secrets_git_modules_or_state() -> TestResult {
    let dir = package()?;
    let paths = packed_paths(dir.path(), &options(None))?;
    assert_eq!(paths, ["README.md", "dist/tools/a.js", "dist/tools/b.ts", "goondan.yaml", "src/index.ts"]);
    let bytes = pack(dir.path(), &options(None))?;
    let names = entry_paths(&bytes)?;
    assert_eq!(names.iter().collect::<Vec<_>>(), paths.iter().collect::<Vec<_>>());
    // Every entry is under `package/`, with fixed owner, time and mode.
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    for entry in archive.entries()? {
        let entry = entry?;
        let header = entry.header();
        assert!(entry.path_bytes().starts_with(b"package/"));
        assert_eq!((header.uid()?, header.gid()?, header.mtime()?, header.mode()?), (0, 0, FIXED_MTIME, 0o644));
    }
    Ok(())
}

#[test]
fn files_list_and_ignore_file_choose_what_goes_in() -> TestResult {
    let dir = package()?;
    let chosen = packed_paths(dir.path(), &options(Some(&["dist", "!dist/**/*.ts"])))?;
    // The manifest and README always go in; `.env*` never, even under a listed directory.
    assert_eq!(chosen, ["README.md", "dist/tools/a.js", "goondan.yaml"]);
    let chosen = packed_paths(dir.path(), &options(Some(&["./src/*.ts"])))?;
    assert_eq!(chosen, ["README.md", "goondan.yaml", "src/index.ts"]);

    write(dir.path(), ".npmignore", "src/\n*.ts\n")?;
    assert_eq!(packed_paths(dir.path(), &options(None))?, ["README.md", "dist/tools/a.js", "goondan.yaml"]);
    // `.goondanignore` wins over `.npmignore`; `!` takes a file back.
    write(dir.path(), ".goondanignore", "# comment\ndist\n!dist/tools/b.ts\n")?;
    assert_eq!(
        packed_paths(dir.path(), &options(None))?,
        ["README.md", "dist/tools/b.ts", "goondan.yaml", "src/index.ts"]
    );
    Ok(())
}

#[test]
fn packing_is_deterministic() -> TestResult {
    let first = package()?;
    let second = package()?;
    // Other times and permissions (but the executable bit) change nothing.
    std::fs::File::open(second.path().join("README.md"))?.set_modified(std::time::SystemTime::UNIX_EPOCH)?;
    let one = pack(first.path(), &options(None))?;
    assert_eq!(one, pack(first.path(), &options(None))?);
    assert_eq!(one, pack(second.path(), &options(None))?);
    assert_eq!(integrity(&one), integrity(&pack(second.path(), &options(None))?));
    Ok(())
}

#[test]
fn round_trip_unpacks_the_same_files() -> TestResult {
    let dir = package()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path().join("dist/tools/a.js"), std::fs::Permissions::from_mode(0o755))?;
    }
    let bytes = pack(dir.path(), &options(None))?;
    let out = tempfile::tempdir()?;
    let dest = out.path().join("store/@goondan/base/1.0.0");
    assert_eq!(unpack(&bytes, &integrity(&bytes), &dest)?, Unpacked::Created);
    for relative in packed_paths(dir.path(), &options(None))? {
        assert_eq!(std::fs::read(dest.join(&relative))?, std::fs::read(dir.path().join(&relative))?, "{relative}");
    }
    assert!(!dest.join(".env").exists() && !dest.join("package").exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(dest.join("dist/tools/a.js"))?.permissions().mode() & 0o777, 0o755);
    }
    // A second install of the same version finds it done, and no temporary directory stays.
    assert_eq!(unpack(&bytes, &integrity(&bytes), &dest)?, Unpacked::AlreadyPresent);
    let left: Vec<_> = std::fs::read_dir(dest.parent().ok_or("no parent")?)?.collect::<Result<_, _>>()?;
    assert_eq!(left.len(), 1, "{left:?}");
    Ok(())
}

#[test]
fn concurrent_unpacks_of_one_package_do_not_corrupt_it() -> TestResult {
    let dir = package()?;
    let bytes = std::sync::Arc::new(pack(dir.path(), &options(None))?);
    let out = tempfile::tempdir()?;
    let dest = out.path().join("pkg");
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let (bytes, dest) = (std::sync::Arc::clone(&bytes), dest.clone());
            std::thread::spawn(move || unpack(&bytes, &integrity(&bytes), &dest).map_err(|e| e.to_string()))
        })
        .collect();
    let mut created = 0;
    for thread in threads {
        if thread.join().map_err(|_| "thread panicked")?? == Unpacked::Created {
            created += 1;
        }
    }
    assert_eq!(created, 1);
    assert_eq!(std::fs::read_to_string(dest.join("goondan.yaml"))?, "kind: Package\n");
    assert_eq!(std::fs::read_dir(out.path())?.count(), 1, "no temporary directory left");
    Ok(())
}

#[test]
fn integrity_is_checked_before_anything_is_written() -> TestResult {
    let dir = package()?;
    let bytes = pack(dir.path(), &options(None))?;
    let out = tempfile::tempdir()?;
    let dest = out.path().join("pkg");
    let other = integrity(b"something else");
    assert!(matches!(unpack(&bytes, &other, &dest), Err(TarballError::IntegrityMismatch { .. })));
    assert!(matches!(unpack(&bytes, "sha1-abc", &dest), Err(TarballError::UnsupportedIntegrity(_))));
    assert!(matches!(unpack(&bytes, "", &dest), Err(TarballError::UnsupportedIntegrity(_))));
    assert!(!out.path().join("pkg").exists());
    // SRI lists: one matching sha512 is enough.
    verify_integrity(&bytes, &format!("sha1-xyz {other} {}", integrity(&bytes)))?;
    assert!(integrity(&bytes).starts_with("sha512-") && integrity(&bytes).len() == 7 + 88);
    Ok(())
}

#[test]
fn refuses_absolute_paths_and_parent_components() -> TestResult {
    let bytes = archive(|b| file(b, "/etc/evil", b"x"))?;
    assert_eq!(refused(&bytes), Some(("/etc/evil".to_owned(), UnsafeReason::Absolute)));
    let bytes = archive(|b| file(b, "package/../../evil", b"x"))?;
    assert_eq!(refused(&bytes), Some(("package/../../evil".to_owned(), UnsafeReason::ParentDir)));
    let bytes = archive(|b| file(b, "package/a\\..\\b", b"x"))?;
    assert_eq!(refused(&bytes).map(|r| r.1), Some(UnsafeReason::Backslash));
    Ok(())
}

#[test]
fn refuses_links_leaving_the_package_and_writes_through_links() -> TestResult {
    let bytes = archive(|b| link(b, tar::EntryType::Symlink, "package/evil", "/etc/passwd"))?;
    assert_eq!(
        refused(&bytes),
        Some(("package/evil".to_owned(), UnsafeReason::LinkOutside { target: "/etc/passwd".to_owned() }))
    );
    let bytes = archive(|b| link(b, tar::EntryType::Symlink, "package/sub/evil", "../../x"))?;
    assert_eq!(refused(&bytes).map(|r| r.0), Some("package/sub/evil".to_owned()));
    let bytes = archive(|b| link(b, tar::EntryType::Link, "package/hard", "../outside"))?;
    assert_eq!(refused(&bytes).map(|r| r.0), Some("package/hard".to_owned()));
    let bytes = archive(|b| link(b, tar::EntryType::Link, "package/hard", "package/missing"))?;
    assert!(matches!(refused(&bytes), Some((_, UnsafeReason::MissingLinkTarget { .. }))));
    // A link to `.` that stays inside, then a file written through it.
    let bytes = archive(|b| {
        link(b, tar::EntryType::Symlink, "package/here", ".")?;
        file(b, "package/here/x", b"x")
    })?;
    assert_eq!(refused(&bytes), Some(("package/here/x".to_owned(), UnsafeReason::ThroughLink)));
    // Lexically inside, but through another link it leaves: `here` is the
    // root, so `here/..` is above it.
    let bytes = archive(|b| {
        link(b, tar::EntryType::Symlink, "package/here", ".")?;
        link(b, tar::EntryType::Symlink, "package/up", "here/..")
    })?;
    assert_eq!(refused(&bytes).map(|r| r.0), Some("package/up".to_owned()));
    // The same with the link it goes through coming later in the archive.
    let bytes = archive(|b| {
        link(b, tar::EntryType::Symlink, "package/up", "later/..")?;
        link(b, tar::EntryType::Symlink, "package/later", ".")
    })?;
    assert_eq!(refused(&bytes).map(|r| r.0), Some("package/up".to_owned()));
    // A loop of links.
    let bytes = archive(|b| {
        link(b, tar::EntryType::Symlink, "package/a", "b")?;
        link(b, tar::EntryType::Symlink, "package/b", "a")
    })?;
    assert_eq!(refused(&bytes).map(|r| r.0), Some("package/a".to_owned()));
    Ok(())
}

#[test]
fn keeps_links_inside_the_package() -> TestResult {
    let bytes = archive(|b| {
        file(b, "package/dist/a.js", b"a")?;
        link(b, tar::EntryType::Symlink, "package/main.js", "dist/a.js")?;
        link(b, tar::EntryType::Link, "package/copy.js", "package/dist/a.js")
    })?;
    let out = tempfile::tempdir()?;
    let dest = out.path().join("pkg");
    unpack(&bytes, &integrity(&bytes), &dest)?;
    assert_eq!(std::fs::read_to_string(dest.join("main.js"))?, "a");
    assert_eq!(std::fs::read_to_string(dest.join("copy.js"))?, "a");
    Ok(())
}

#[test]
fn refuses_device_files_and_fifos() -> TestResult {
    for kind in [tar::EntryType::Char, tar::EntryType::Block, tar::EntryType::Fifo] {
        let bytes = archive(|b| link(b, kind, "package/dev", ""))?;
        assert_eq!(refused(&bytes), Some(("package/dev".to_owned(), UnsafeReason::Device)), "{kind:?}");
    }
    Ok(())
}

#[test]
fn garbage_is_a_corrupt_archive() -> TestResult {
    let out = tempfile::tempdir()?;
    let bytes = b"registry test tarball";
    assert!(matches!(unpack(bytes, &integrity(bytes), &out.path().join("pkg")), Err(TarballError::Corrupt(_))));
    assert!(!out.path().join("pkg").exists());
    Ok(())
}

#[test]
fn an_unpack_replaces_what_does_not_record_its_integrity_and_keeps_what_does() -> TestResult {
    let dir = package()?;
    let bytes = pack(dir.path(), &options(None))?;
    let sum = integrity(&bytes);
    let out = tempfile::tempdir()?;
    let dest = out.path().join("1.0.0");
    // A directory without a marker (a half install of an older gdn, or
    // anything else) is no install: replaced.
    std::fs::create_dir_all(dest.join("stray"))?;
    assert_eq!(unpack(&bytes, &sum, &dest)?, Unpacked::Replaced);
    assert!(!dest.join("stray").exists());
    assert_eq!(recorded_integrity(&dest).as_deref(), Some(sum.as_str()));
    // Another integrity recorded: replaced too.
    std::fs::write(dest.join(INTEGRITY_MARKER), "sha512-other")?;
    assert_eq!(unpack(&bytes, &sum, &dest)?, Unpacked::Replaced);
    assert_eq!(recorded_integrity(&dest).as_deref(), Some(sum.as_str()));
    // Its own: left as it is.
    std::fs::write(dest.join("added-later"), "x")?;
    assert_eq!(unpack(&bytes, &sum, &dest)?, Unpacked::AlreadyPresent);
    assert!(dest.join("added-later").exists());
    assert_eq!(std::fs::read_dir(out.path())?.count(), 1, "nothing left beside it");
    Ok(())
}

#[test]
fn leftovers_of_killed_unpacks_are_removed_and_nothing_else() -> TestResult {
    let out = tempfile::tempdir()?;
    let dest = out.path().join("1.0.0");
    for left in [".1.0.0.unpacking-abc", ".1.0.0.stale-def/old", ".2.0.0.unpacking-ghi", "1.0.0/goondan.yaml"] {
        std::fs::create_dir_all(out.path().join(left))?;
    }
    assert_eq!(remove_leftovers(&dest)?, 2);
    let mut left: Vec<String> =
        std::fs::read_dir(out.path())?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, [".2.0.0.unpacking-ghi", "1.0.0"]);
    Ok(())
}
