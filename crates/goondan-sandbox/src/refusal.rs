//! Reading a confined command's error output for what the sandbox refused,
//! so that the model is told which policy stopped it and does not retry
//! blindly.

use std::collections::BTreeSet;

/// What a failed confined command's output says was refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusal {
    /// Paths named beside a permission error (at most a few).
    pub paths: Vec<String>,
    /// Whether it failed to reach the network.
    pub network: bool,
    /// Whether some operation was refused with no path or host named.
    pub other: bool,
}

/// How many refused paths a result names.
const MAX_PATHS: usize = 5;

/// Markers of a refusal in error output (libc's texts, Python's and Node's).
const DENIALS: &[&str] =
    &["Permission denied", "Operation not permitted", "Read-only file system", "EACCES", "EPERM", "EROFS"];

/// Markers of a refused network attempt.
const NETWORK: &[&str] = &[
    "connect",
    "socket",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Could not resolve host",
    "getaddrinfo",
    "Name or service not known",
];

/// What `output` (a command's stderr, then stdout) says was refused; `None`
/// when it shows no refusal.
pub fn refusal_in(output: &str) -> Option<Refusal> {
    let mut paths = BTreeSet::new();
    let mut refusal = Refusal::default();
    for line in output.lines() {
        let denied = DENIALS.iter().any(|marker| line.contains(marker));
        let network_line = NETWORK.iter().any(|marker| line.contains(marker));
        if network_line
            && (denied || line.contains("resolve") || line.contains("unreachable") || line.contains("name resolution"))
        {
            refusal.network = true;
            continue;
        }
        if !denied {
            continue;
        }
        match path_in(line) {
            Some(path) => {
                paths.insert(path);
            }
            None => refusal.other = true,
        }
    }
    refusal.paths = paths.into_iter().take(MAX_PATHS).collect();
    (refusal.network || refusal.other || !refusal.paths.is_empty()).then_some(refusal)
}

/// The absolute or relative path a permission-error line names: quoted
/// (`'…'`, `"…"`, `‘…’`), or a `prog: path: message` field.
fn path_in(line: &str) -> Option<String> {
    for (open, close) in [('\'', '\''), ('"', '"'), ('‘', '’'), ('`', '\'')] {
        let mut rest = line;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else { break };
            let candidate = &after[..end];
            if looks_like_path(candidate) {
                return Some(candidate.to_owned());
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
    line.split(": ").map(str::trim).find(|field| looks_like_path(field) && !field.contains(' ')).map(str::to_owned)
}

fn looks_like_path(text: &str) -> bool {
    !text.is_empty()
        && (text.starts_with('/') || text.starts_with("./") || text.starts_with("../") || text.starts_with("~/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_paths_of_common_tools() {
        let output = "cat: /root/.ssh/id_rsa: Permission denied\n\
                      touch: cannot touch '/etc/x': Permission denied\n\
                      bash: line 1: /work/p/.git/config: Read-only file system\n\
                      PermissionError: [Errno 13] Permission denied: '/home/u/.aws/credentials'\n";
        let Some(refusal) = refusal_in(output) else { panic!("no refusal found") };
        assert_eq!(
            refusal.paths,
            vec!["/etc/x", "/home/u/.aws/credentials", "/root/.ssh/id_rsa", "/work/p/.git/config"]
        );
        assert!(!refusal.network);
    }

    #[test]
    fn tells_network_refusals_apart() {
        let Some(refusal) = refusal_in("curl: (7) Failed to connect to 127.0.0.1 port 80: Permission denied\n") else {
            panic!("no refusal found")
        };
        assert!(refusal.network);
        assert!(refusal.paths.is_empty());
        let Some(refusal) = refusal_in("socket: Operation not permitted\n") else { panic!("no refusal found") };
        assert!(refusal.network);
    }

    #[test]
    fn an_ordinary_failure_is_not_a_refusal() {
        assert_eq!(refusal_in("ls: cannot access 'x': No such file or directory\n"), None);
        assert_eq!(refusal_in(""), None);
    }

    #[test]
    fn a_refusal_without_a_path_is_still_one() {
        let Some(refusal) = refusal_in("unshare: unshare failed: Operation not permitted\n") else {
            panic!("no refusal found")
        };
        assert!(refusal.other);
    }
}
