//! Instance directory names: agent name and instance key, each
//! percent-encoded, joined with `@` (and the old layout's `<encoded key>`).

/// The longest directory name most file systems accept, in bytes.
pub(super) const MAX_DIR_NAME_BYTES: usize = 255;

/// The directory name of the instance of `agent` for `key`
/// (`<encoded agent>@<encoded key>`), or `None` if the pair is refused
/// (either empty, `.` or `..`, or a name longer than 255 bytes).
pub fn instance_dir_name(agent: &str, key: &str) -> Option<String> {
    encode_instance(agent, key).ok()
}

/// The (agent name, instance key) a directory name encodes, or `None` if
/// `name` is not the encoding of any pair (the inverse of
/// [`instance_dir_name`]; old-layout names, which hold no `@`, are `None`).
pub fn parse_instance_dir_name(name: &str) -> Option<(String, String)> {
    // Neither encoded part holds an `@`, so the first one is the separator;
    // a second one makes the key part non-canonical, refused below.
    let (agent, key) = name.split_once('@')?;
    let (agent, key) = (decode_name(agent)?, decode_name(key)?);
    (encode_instance(&agent, &key).ok()? == name).then_some((agent, key))
}

/// The key an old-layout directory name (`<encoded key>`) encodes, or `None`.
pub(super) fn legacy_key_from_dir_name(name: &str) -> Option<String> {
    let key = decode_name(name)?;
    (encode_key(&key).ok()? == name).then_some(key)
}

/// Undoes [`encode_name`]: the name whose canonical encoding (upper-case
/// hex, safe bytes kept) is `encoded`, or `None`.
pub(super) fn decode_name(encoded: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut rest = encoded.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'%' {
            let (&high, tail) = tail.split_first()?;
            let (&low, tail) = tail.split_first()?;
            bytes.push(hex_value(high)? << 4 | hex_value(low)?);
            rest = tail;
        } else {
            bytes.push(byte);
            rest = tail;
        }
    }
    let name = String::from_utf8(bytes).ok()?;
    (encode_name(&name, usize::MAX).ok()? == encoded).then_some(name)
}

pub(super) fn is_kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

pub(super) const TOO_LONG: &str =
    "the agent name and instance key are too long (their directory name would exceed 255 bytes)";

/// `<encoded agent>@<encoded key>`, or why the pair cannot name a directory.
pub(super) fn encode_instance(agent: &str, key: &str) -> Result<String, &'static str> {
    let agent = encode_name(agent, MAX_DIR_NAME_BYTES).map_err(|refusal| match refusal {
        NameRefusal::Empty => "an agent name must not be empty",
        NameRefusal::Dots => "the agent names `.` and `..` are refused (they name directories)",
        NameRefusal::TooLong => TOO_LONG,
    })?;
    let key = encode_name(key, MAX_DIR_NAME_BYTES).map_err(key_refusal)?;
    if agent.len() + 1 + key.len() > MAX_DIR_NAME_BYTES {
        return Err(TOO_LONG);
    }
    Ok(format!("{agent}@{key}"))
}

pub(super) fn key_refusal(refusal: NameRefusal) -> &'static str {
    match refusal {
        NameRefusal::Empty => "an instance key must not be empty",
        NameRefusal::Dots => "the instance keys `.` and `..` are refused (they name directories)",
        NameRefusal::TooLong => TOO_LONG,
    }
}

/// The old layout's directory name of `key`.
pub(super) fn encode_key(key: &str) -> Result<String, NameRefusal> {
    encode_name(key, MAX_DIR_NAME_BYTES)
}

/// Why [`encode_name`] refused a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameRefusal {
    /// The name is empty.
    Empty,
    /// The name is `.` or `..`, which name existing directories.
    Dots,
    /// The encoded name is longer than allowed.
    TooLong,
}

/// Encodes a user-chosen name as one path component: `[A-Za-z0-9._-]` kept,
/// every other byte of its UTF-8 percent-encoded (upper-case hex), so the
/// result never holds a path separator and is injective. Shared by instance
/// directories and extension state files so both confine names the same way.
pub(crate) fn encode_name(name: &str, max_bytes: usize) -> Result<String, NameRefusal> {
    if name.is_empty() {
        return Err(NameRefusal::Empty);
    }
    if name == "." || name == ".." {
        return Err(NameRefusal::Dots);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut encoded = String::with_capacity(name.len());
    for &byte in name.as_bytes() {
        if is_kept(byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push('%');
            encoded.push(char::from(HEX[usize::from(byte >> 4)]));
            encoded.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    if encoded.len() > max_bytes {
        return Err(NameRefusal::TooLong);
    }
    Ok(encoded)
}

pub(super) fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}
