//! The journal's rules, checked on real files.

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Rec {
    n: u32,
    text: String,
}

fn rec(n: u32) -> Rec {
    Rec { n, text: format!("record {n}") }
}

fn line(record: &Rec) -> Vec<u8> {
    let mut line = serde_json::to_vec(record).unwrap_or_default();
    line.push(b'\n');
    line
}

fn lines(records: &[Rec]) -> Vec<u8> {
    records.iter().flat_map(line).collect()
}

fn read_all(path: &Path) -> (Vec<Rec>, Replayed) {
    let mut records = Vec::new();
    let replayed = replay::<Rec>(path, |record| records.push(record)).unwrap_or_else(|e| panic!("replay: {e}"));
    (records, replayed)
}

/// A temporary directory and the path of a journal in it, not yet created
/// (the directory goes when the first is dropped).
fn journal_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = must(tempfile::tempdir());
    let path = dir.path().join("log.jsonl");
    (dir, path)
}

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_missing_journal_is_empty_and_opening_creates_it_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let (_dir, path) = journal_file();
    let (records, replayed) = read_all(&path);
    assert!(records.is_empty() && replayed.torn.is_none() && replayed.end == 0);
    let mut journal = must(Journal::open::<Rec>(&path));
    must(journal.append(&line(&rec(1)), &[]));
    assert_eq!(must(fs::metadata(&path)).permissions().mode() & 0o777, FILE_MODE);
    assert_eq!(read_all(&path).0, [rec(1)]);
}

#[test]
fn a_torn_tail_without_a_newline_is_skipped_then_cut_before_the_next_append() {
    let (_dir, path) = journal_file();
    let mut text = lines(&[rec(1), rec(2)]);
    let half = line(&rec(3));
    text.extend_from_slice(&half[..half.len() / 2]);
    must(fs::write(&path, &text));

    let (records, replayed) = read_all(&path);
    assert_eq!(records, [rec(1), rec(2)]);
    let Some(torn) = replayed.torn else { panic!("no torn tail") };
    assert_eq!((torn.line, torn.reason), (Some(3), TornReason::NoNewline));
    assert_eq!(torn.bytes as usize, half.len() / 2);
    assert!(replayed.corrupt.is_empty());

    // Opening does not touch the file; the first append cuts the tail.
    let mut journal = must(Journal::open::<Rec>(&path));
    assert_eq!(must(fs::read(&path)), text);
    must(journal.append(&line(&rec(4)), &[]));
    assert_eq!(must(fs::read(&path)), lines(&[rec(1), rec(2), rec(4)]));
}

#[test]
fn an_unparsable_last_line_is_a_torn_tail_and_is_cut_on_repair() {
    let (_dir, path) = journal_file();
    let mut text = lines(&[rec(1)]);
    text.extend_from_slice(b"\0\0\0\0\n");
    must(fs::write(&path, &text));
    let (records, replayed) = read_all(&path);
    assert_eq!(records, [rec(1)]);
    assert!(matches!(replayed.torn, Some(TornTail { line: Some(2), reason: TornReason::Unparsable(_), .. })));
    assert_eq!(replayed.end as usize, lines(&[rec(1)]).len());

    let mut journal = must(Journal::open::<Rec>(&path));
    let repaired = must(journal.repair_tail());
    assert!(matches!(repaired, Some(TornTail { reason: TornReason::Unparsable(_), bytes: 5, .. })), "{repaired:?}");
    assert_eq!(must(fs::read(&path)), lines(&[rec(1)]));
    // A clean end is left alone.
    assert_eq!(must(journal.repair_tail()), None);
    // JSON that is not a record of the journal's type is unparsable too.
    must(fs::OpenOptions::new().append(true).open(&path).and_then(|mut f| f.write_all(b"{\"other\":true}\n")));
    let mut journal = must(Journal::open::<Rec>(&path));
    assert!(must(journal.repair_tail()).is_some());
    assert_eq!(must(fs::read(&path)), lines(&[rec(1)]));
}

#[test]
fn a_long_torn_tail_is_found_across_read_chunks() {
    let (_dir, path) = journal_file();
    let long = Rec { n: 2, text: "x".repeat(40_000) };
    let mut text = lines(&[rec(1), long.clone()]);
    must(fs::write(&path, &text));
    let mut journal = must(Journal::open::<Rec>(&path));
    assert_eq!(must(journal.repair_tail()), None, "a long complete last line parses");
    text.extend_from_slice(&line(&long)[..30_000]);
    must(fs::write(&path, &text));
    let mut journal = must(Journal::open::<Rec>(&path));
    assert!(must(journal.repair_tail()).is_some());
    assert_eq!(read_all(&path).0, [rec(1), long]);
}

#[test]
fn a_bad_line_in_the_middle_is_a_corrupt_line_with_its_number() {
    let (_dir, path) = journal_file();
    let mut text = lines(&[rec(1)]);
    text.extend_from_slice(b"not json\n\n");
    text.extend_from_slice(&lines(&[rec(2)]));
    text.extend_from_slice(b"{\"n\":\"x\"}\n");
    text.extend_from_slice(&lines(&[rec(3)]));
    must(fs::write(&path, &text));
    let (records, replayed) = read_all(&path);
    assert_eq!(records, [rec(1), rec(2), rec(3)], "readable records around bad lines are kept");
    assert_eq!(replayed.corrupt.iter().map(|c| c.line).collect::<Vec<_>>(), [2, 5]);
    assert!(replayed.torn.is_none());
    match replayed.strict(&path) {
        Err(JournalError::Corrupt { line: 2, path: at, .. }) => assert_eq!(at, path),
        other => panic!("not refused: {other:?}"),
    }
    // Nothing of the middle is cut by a writer.
    let mut journal = must(Journal::open::<Rec>(&path));
    assert_eq!(must(journal.repair_tail()), None);
    assert_eq!(must(fs::read(&path)), text);
}

#[test]
fn an_unparsable_line_before_a_torn_one_is_corrupt_and_only_the_torn_one_is_cut() {
    let (_dir, path) = journal_file();
    let mut text = lines(&[rec(1)]);
    text.extend_from_slice(b"garbage\n{\"n\":");
    must(fs::write(&path, &text));
    let (_, replayed) = read_all(&path);
    assert_eq!(replayed.corrupt.iter().map(|c| c.line).collect::<Vec<_>>(), [2]);
    assert!(matches!(replayed.torn, Some(TornTail { line: Some(3), reason: TornReason::NoNewline, .. })));
    let mut journal = must(Journal::open::<Rec>(&path));
    must(journal.cut_torn_tail(&replayed));
    assert_eq!(must(fs::read(&path)), [lines(&[rec(1)]), b"garbage\n".to_vec()].concat());
}

#[test]
fn a_rewrite_replaces_the_journal_and_later_appends_go_to_the_new_file() {
    let (dir, path) = journal_file();
    let mut journal = must(Journal::open::<Rec>(&path));
    must(journal.append(&lines(&[rec(1), rec(2), rec(3)]), &[]));
    let temp = dir.path().join("log.jsonl.tmp");
    must(journal.rewrite(&temp, None, |out| out.write_all(&line(&rec(3)))));
    assert!(!temp.exists());
    assert_eq!(journal.len() as usize, line(&rec(3)).len());
    must(journal.append(&line(&rec(4)), &[]));
    assert_eq!(read_all(&path).0, [rec(3), rec(4)]);
}

#[test]
fn unsynced_writes_are_synced_on_flush() {
    let dir = must(tempfile::tempdir());
    let path = dir.path().join("events.jsonl");
    must(fs::write(&path, b"{\"n\":1,\"text\":\"a\"}\n{\"n\":"));
    let mut journal = must(Journal::open::<serde::de::IgnoredAny>(&path));
    let piece = b"{\"n\":2,";
    assert_eq!(must(journal.write_unsynced(piece, goondan_core::fault::Point::EventsLog)), piece.len());
    must(journal.write_unsynced(b"\"text\":\"b\"}\n", goondan_core::fault::Point::EventsLog));
    must(journal.sync());
    assert_eq!(read_all(&path).0, [Rec { n: 1, text: "a".into() }, Rec { n: 2, text: "b".into() }]);
}

#[test]
fn concurrent_appenders_each_return_once_their_line_is_durable() {
    let (_dir, path) = journal_file();
    let group = Arc::new(GroupCommit::new(must(Journal::open::<Rec>(&path))));
    let threads: Vec<_> = (0..8_u32)
        .map(|t| {
            let group = Arc::clone(&group);
            let path = path.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let record = rec(t * 1000 + i);
                    must(group.append(&line(&record), None));
                    // On return the line is in the file (whole).
                    let text = must(fs::read(&path));
                    let mine = line(&record);
                    assert!(text.windows(mine.len()).any(|w| w == mine.as_slice()), "{record:?} not written");
                }
            })
        })
        .collect();
    for thread in threads {
        assert!(thread.join().is_ok());
    }
    let (mut records, replayed) = read_all(&path);
    assert!(replayed.torn.is_none() && replayed.corrupt.is_empty());
    records.sort_by_key(|r| r.n);
    let mut expected: Vec<Rec> = (0..8).flat_map(|t| (0..50).map(move |i| rec(t * 1000 + i))).collect();
    expected.sort_by_key(|r| r.n);
    assert_eq!(records, expected, "every line once, none torn or interleaved");
    assert!(group.batches() <= 400);
}

#[test]
fn appenders_that_wait_for_a_write_share_the_next_batch() {
    let (_dir, path) = journal_file();
    let group = Arc::new(GroupCommit::new(must(Journal::open::<Rec>(&path))));
    // A write under way: the journal is with a leader.
    let journal = group.lock().journal.take();
    let threads: Vec<_> = (0..8_u32)
        .map(|n| {
            let group = Arc::clone(&group);
            std::thread::spawn(move || group.append(&line(&rec(n)), None))
        })
        .collect();
    // Every appender has added its line to the open batch and waits.
    let want: usize = (0..8).map(|n| line(&rec(n)).len()).sum();
    while group.lock().lines.len() < want {
        std::thread::yield_now();
    }
    assert_eq!(must(fs::read(&path)).len(), 0, "nothing is written while a write is under way");
    // The write ends: one of them leads the batch for all.
    {
        let mut state = group.lock();
        state.journal = journal;
        group.settled.notify_all();
    }
    for thread in threads {
        match thread.join() {
            Ok(result) => must(result),
            Err(_) => panic!("an appender panicked"),
        }
    }
    assert_eq!(group.batches(), 1, "eight appends, one write and one fsync");
    assert_eq!(read_all(&path).0.len(), 8);
}

#[test]
fn a_tail_reads_what_was_appended_and_notices_a_rewrite() {
    let (dir, path) = journal_file();
    let mut tail = Tail::new(&path);
    let mut seen: Vec<Rec> = Vec::new();
    let read = |tail: &mut Tail, seen: &mut Vec<Rec>| {
        tail.read_new(|line| {
            if let Ok(record) = serde_json::from_slice(line) {
                seen.push(record);
            }
        })
    };
    assert_eq!(read(&mut tail, &mut seen), TailRead::Missing);
    let mut journal = must(Journal::open::<Rec>(&path));
    must(journal.append(&lines(&[rec(1), rec(2)]), &[]));
    assert_eq!(read(&mut tail, &mut seen), TailRead::Lines(2));
    assert_eq!(read(&mut tail, &mut seen), TailRead::Lines(0));
    // A line still being written waits for its newline.
    let third = line(&rec(3));
    must(journal.write_unsynced(&third[..5], goondan_core::fault::Point::EventsLog));
    assert_eq!(read(&mut tail, &mut seen), TailRead::Lines(0));
    must(journal.write_unsynced(&third[5..], goondan_core::fault::Point::EventsLog));
    assert_eq!(read(&mut tail, &mut seen), TailRead::Lines(1));
    assert_eq!(seen, [rec(1), rec(2), rec(3)]);
    assert_eq!(tail.offset(), journal.len());
    // Compacted, even to a longer file: another inode.
    let temp = dir.path().join("log.jsonl.tmp");
    must(journal.rewrite(&temp, None, |out| out.write_all(&lines(&[rec(7), rec(8), rec(9), rec(10)]))));
    assert_eq!(read(&mut tail, &mut seen), TailRead::Rewritten);
    tail.restart();
    seen.clear();
    assert_eq!(read(&mut tail, &mut seen), TailRead::Lines(4));
    assert_eq!(seen, [rec(7), rec(8), rec(9), rec(10)]);
}

#[test]
fn a_failed_batch_fails_each_of_its_appenders_alike() {
    let error = JournalError::Io(PathIoError::new("appending to", "/x", std::io::Error::from_raw_os_error(28)));
    let again = error.duplicate();
    assert_eq!(again.to_string(), error.to_string());
    assert_eq!(again.io_source().map(std::io::Error::kind), error.io_source().map(std::io::Error::kind));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever a crash keeps of a valid journal — any prefix of its bytes —
    /// replays to a prefix of its records, every complete line's record,
    /// and a writer that opens it cuts it back to exactly those lines.
    #[test]
    fn any_prefix_of_a_valid_journal_opens_to_a_prefix_of_its_records(
        texts in proptest::collection::vec("[a-z \"\\\\\u{e9}\u{1F642}]{0,40}", 0..12),
        cut in any::<proptest::sample::Index>(),
    ) {
        let records: Vec<Rec> =
            texts.into_iter().enumerate().map(|(n, text)| Rec { n: n as u32, text }).collect();
        let text = lines(&records);
        let cut = cut.index(text.len() + 1);
        let prefix = &text[..cut];
        let complete = prefix.iter().filter(|&&b| b == b'\n').count();
        let dir = must(tempfile::tempdir());
        let path = dir.path().join("log.jsonl");
        must(fs::write(&path, prefix));

        let (read, replayed) = read_all(&path);
        prop_assert_eq!(&read[..], &records[..complete]);
        prop_assert!(replayed.corrupt.is_empty());
        prop_assert_eq!(replayed.torn.is_some(), cut > 0 && prefix.last() != Some(&b'\n'));
        let good = lines(&records[..complete]);
        prop_assert_eq!(replayed.end as usize, good.len());

        let mut journal = must(Journal::open::<Rec>(&path));
        must(journal.repair_tail());
        prop_assert_eq!(must(fs::read(&path)), good);
        // And the next record lands on a clean line.
        let next = Rec { n: 999, text: "after".into() };
        must(journal.append(&line(&next), &[]));
        let (again, replayed) = read_all(&path);
        prop_assert!(replayed.torn.is_none());
        prop_assert_eq!(again.last(), Some(&next));
        prop_assert_eq!(again.len(), complete + 1);
    }
}
