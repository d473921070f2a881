//! What the command line reads besides the bundle — `--input-file`,
//! `--args-file`, `--env-file` and the bundle's `.env` files, or standard
//! input for `-` — read within a bound.
//!
//! A plain `read_to_string` of `/dev/zero` grows without end (gigabytes in
//! seconds), so a device, a socket or a directory is refused before it is
//! opened, and everything else is read through `take(cap + 1)`: a file
//! that grows under us, or standard input that never ends, stops at the
//! cap with an error that names the limit. A FIFO is read (it ends when its
//! writer does: `--input-file <(make-prompt)`), within the same cap.

use std::io::Read;
use std::path::Path;

/// The most `--input-file` (or `-`) may hold: one turn's input.
pub const MAX_INPUT_BYTES: u64 = 8 << 20;
/// The most `--args-file` (or `-`) may hold: one tool call's arguments.
pub const MAX_ARGS_BYTES: u64 = 16 << 20;
/// The most one `.env` file may hold.
pub const MAX_ENV_FILE_BYTES: u64 = 1 << 20;

/// `8 MiB`, `512 KiB`, `100 bytes`.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// Reads the text `option` names: `path`, or standard input for `-`, at
/// most `cap` bytes, UTF-8. Errors are whole sentences naming the option.
pub fn read_text(path: &Path, option: &str, cap: u64) -> Result<String, String> {
    if path == Path::new("-") {
        return read_capped(std::io::stdin().lock(), cap)
            .map_err(|e| format!("cannot read {option} from standard input: {e}"))?
            .ok_or_else(|| format!("standard input ({option} -) holds more than {} (the limit)", size(cap)))
            .and_then(|bytes| {
                String::from_utf8(bytes).map_err(|_| format!("standard input ({option} -) is not UTF-8 text"))
            });
    }
    let shown = path.display();
    // Before opening: a device never ends, and a socket cannot be opened.
    let metadata = std::fs::metadata(path).map_err(|e| format!("cannot read {option} {shown}: {e}"))?;
    if let Some(kind) = not_readable(&metadata) {
        return Err(format!("{option} {shown} is {kind}, not a file"));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {option} {shown}: {e}"))?;
    // The path may name something else by now.
    let metadata = file.metadata().map_err(|e| format!("cannot read {option} {shown}: {e}"))?;
    if let Some(kind) = not_readable(&metadata) {
        return Err(format!("{option} {shown} is {kind}, not a file"));
    }
    let bytes = read_capped(file, cap)
        .map_err(|e| format!("cannot read {option} {shown}: {e}"))?
        .ok_or_else(|| format!("{option} {shown} is larger than {} (the limit)", size(cap)))?;
    String::from_utf8(bytes).map_err(|_| format!("{option} {shown} is not UTF-8 text"))
}

/// At most `cap` bytes of `reader`, or `None` if it holds more.
fn read_capped(reader: impl Read, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    reader.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= cap).then_some(bytes))
}

/// What a file is when it is nothing a read can end on (or start on).
fn not_readable(metadata: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let kind = metadata.file_type();
    if kind.is_dir() {
        Some("a directory")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_cap() {
        assert_eq!(read_capped(&b"abcd"[..], 4).ok().flatten().as_deref(), Some(&b"abcd"[..]));
        assert_eq!(read_capped(&b"abcde"[..], 4).ok().flatten(), None);
        // An endless reader ends at cap + 1 bytes.
        assert_eq!(read_capped(std::io::repeat(0), 1000).ok().flatten(), None);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(8 << 20), "8 MiB");
        assert_eq!(size(512 << 10), "512 KiB");
        assert_eq!(size(100), "100 bytes");
    }

    #[test]
    fn devices_and_directories_are_refused_before_reading() {
        let error = read_text(Path::new("/dev/zero"), "--input-file", 10).err().unwrap_or_default();
        assert_eq!(error, "--input-file /dev/zero is a character device, not a file");
        let error = read_text(Path::new("/"), "--args-file", 10).err().unwrap_or_default();
        assert_eq!(error, "--args-file / is a directory, not a file");
    }
}
