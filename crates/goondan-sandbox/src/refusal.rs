//! Reading a confined command's error output for what the sandbox refused,
//! so that the model is told which policy stopped it and does not retry
//! blindly.

use std::collections::BTreeSet;

/// Markers of a request the `network.allow` proxy refused: its own reason
/// (which names the policy), and how curl and Python report a refused
/// `CONNECT` (curl leaves the reason out).
const PROXY_REFUSALS: &[&str] =
    &["spec.sandbox.network.allow", "CONNECT tunnel failed, response 403", "Tunnel connection failed: 403"];

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

/// Markers of a missing file in error output: what a path outside a
/// command's own root looks like from inside it.
const MISSING: &[&str] = &["No such file or directory", "Directory nonexistent", "ENOENT"];

/// What `output` (a command's stderr, then stdout) says was refused; `None`
/// when it shows no refusal.
pub fn refusal_in(output: &str) -> Option<Refusal> {
    refusal_in_view(output, |_| true)
}

/// [`refusal_in`] for a command with a root of its own, which sees only
/// the paths `sees` accepts: a missing absolute path it does not see is a
/// refusal too (it exists, or not, outside; the command cannot know).
pub(crate) fn refusal_in_view(output: &str, sees: impl Fn(&std::path::Path) -> bool) -> Option<Refusal> {
    let mut found = refusal_by_denials(output);
    for line in output.lines() {
        if let Some(path) = path_before(line, MISSING).filter(|path| path.starts_with('/'))
            && !sees(std::path::Path::new(&path))
        {
            let refusal = found.get_or_insert_with(Refusal::default);
            if !refusal.paths.contains(&path) && refusal.paths.len() < MAX_PATHS {
                refusal.paths.push(path);
                refusal.paths.sort();
            }
        }
    }
    found
}

fn refusal_by_denials(output: &str) -> Option<Refusal> {
    let mut paths = BTreeSet::new();
    let mut refusal = Refusal::default();
    for line in output.lines() {
        let denied = DENIALS.iter().any(|marker| line.contains(marker));
        if PROXY_REFUSALS.iter().any(|marker| line.contains(marker)) {
            refusal.network = true;
            continue;
        }
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

/// The path a permission-error line names: the field just before the
/// message (`cat: /x: Permission denied`, `sh: 1: cannot create .git/config:
/// Read-only file system`, `touch: cannot touch '/x': …`), or a quoted one
/// just after it (Python's `Permission denied: '/x'`).
fn path_in(line: &str) -> Option<String> {
    path_before(line, DENIALS)
}

/// The path a line names beside the first of `markers` (see [`path_in`]).
fn path_before(line: &str, markers: &[&str]) -> Option<String> {
    let at = markers.iter().filter_map(|marker| line.find(marker)).min()?;
    let after = &line[at..];
    if let Some(quoted) = after.split('\'').nth(1).filter(|text| looks_like_path(text)) {
        return Some(quoted.to_owned());
    }
    let before = line[..at].trim_end().trim_end_matches(':').trim_end();
    let field = before.rsplit(": ").next()?.trim();
    let field =
        ["cannot create ", "cannot open ", "cannot touch ", "cannot remove ", "can't open file ", "can't create "]
            .iter()
            .find_map(|prefix| field.strip_prefix(prefix))
            .unwrap_or(field);
    let field = field.trim_matches(|c| matches!(c, '\'' | '"' | '‘' | '’' | '`'));
    looks_like_path(field).then(|| field.to_owned())
}

/// Whether `text` reads as a path: no spaces, and a slash or a leading dot.
fn looks_like_path(text: &str) -> bool {
    !text.is_empty() && !text.contains(' ') && (text.contains('/') || text.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_paths_of_common_tools() {
        let output = "cat: /root/.ssh/id_rsa: Permission denied\n\
                      touch: cannot touch '/etc/x': Permission denied\n\
                      bash: line 1: /work/p/.git/config: Read-only file system\n\
                      /bin/sh: 1: cannot create .git/hooks/x: Read-only file system\n\
                      PermissionError: [Errno 13] Permission denied: '/home/u/.aws/credentials'\n";
        let Some(refusal) = refusal_in(output) else { panic!("no refusal found") };
        assert_eq!(
            refusal.paths,
            vec![".git/hooks/x", "/etc/x", "/home/u/.aws/credentials", "/root/.ssh/id_rsa", "/work/p/.git/config"]
        );
        assert!(!refusal.network);
    }

    #[test]
    fn a_missing_path_outside_the_view_is_a_refusal_and_one_inside_is_not() {
        let sees = |path: &std::path::Path| path.starts_with("/work");
        let output = "/bin/sh: 1: cannot create /tmp/x/pwned: Directory nonexistent\n\
                      cat: /work/missing.txt: No such file or directory\n";
        let Some(refusal) = refusal_in_view(output, sees) else { panic!("no refusal found") };
        assert_eq!(refusal.paths, vec!["/tmp/x/pwned"]);
        assert!(refusal_in_view("cat: /work/missing.txt: No such file or directory\n", sees).is_none());
        assert!(refusal_in("cat: /tmp/x: No such file or directory\n").is_none());
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
    fn tells_refusals_of_the_network_proxy() {
        for output in [
            "curl: (56) CONNECT tunnel failed, response 403\n",
            "goondan sandbox: 10.0.0.1:80 is not in the agent's spec.sandbox.network.allow (127.0.0.1:8080); \
             connections go only to the hosts listed there\n",
            "urllib.error.URLError: <urlopen error Tunnel connection failed: 403 goondan sandbox: x>\n",
        ] {
            let Some(refusal) = refusal_in(output) else { panic!("no refusal found in {output}") };
            assert!(refusal.network && refusal.paths.is_empty() && !refusal.other, "{output}");
        }
        assert_eq!(refusal_in("curl: (56) CONNECT tunnel failed, response 407\n"), None);
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
