//! The keys of one lock on etcd, and the transactions of fair, shared and permit locks (see the
//! layout on [`Keys`]). Everything here builds requests or reads answers: no I/O.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse,
};

use crate::backend::{Attempt, Mode, Token};

/// What an entry under a lock key is: its tag in the key, and the value it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    /// A semaphore's holder or waiter (value `permits=N`).
    Permit,
    /// A fair lock's holder (the first) or waiter (value `fair`).
    Queue,
    /// A shared holder, a reader (value `shared-r`).
    Reader,
    /// A writer (an exclusive caller) waiting for readers (value `shared-w`).
    Writer,
}

impl Tag {
    fn byte(self) -> u8 {
        match self {
            Tag::Permit => b'p',
            Tag::Queue => b'q',
            Tag::Reader => b'r',
            Tag::Writer => b'w',
        }
    }

    /// The entry a caller of `mode` puts; `None` for an exclusive lock, which is the lock key.
    pub(super) fn of(mode: Mode) -> Option<Tag> {
        match mode {
            Mode::Exclusive => None,
            Mode::Fair => Some(Tag::Queue),
            Mode::Shared => Some(Tag::Reader),
            Mode::Permits(_) => Some(Tag::Permit),
        }
    }
}

/// The value of an entry of `mode` (a writer's mark for `Exclusive`).
fn value(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "shared-w".to_owned(),
        Mode::Fair => "fair".to_owned(),
        Mode::Shared => "shared-r".to_owned(),
        Mode::Permits(n) => format!("permits={n}"),
    }
}

/// How another caller uses a key, from one of its entries, in the terms of
/// [`Attempt::mismatch`]: -1 exclusive (or fair), 0 shared, else the
/// permit count.
fn other_of(kv: &KeyValue) -> i64 {
    let value = kv.value();
    if value == b"shared-r" || value == b"shared-w" {
        return 0;
    }
    value
        .strip_prefix(b"permits=")
        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<i64>().ok())
        .unwrap_or(-1)
}

/// One lock's keys in etcd: the lock key `K` (an exclusive holder's), and the entries under it,
/// `K \0 tag \0 token`.
///
/// Layout, per lock: its key `K = prefix + name` (each NUL byte of it followed by 0x7f, so that
/// nothing below is ever another lock's key, nor falls in a range compared), which holds the token
/// of an exclusive holder; and entries `K \0 tag \0 token` for the other kinds, each holding what
/// it is, so that callers that use the key another way find out (a `Mismatch`, worded as for
/// Redis):
/// - `q`, value `fair`: a fair lock's line. The entry with the lowest create revision holds the
///   lock (while `K` is absent); the others wait in that order;
/// - `r`, value `shared-r`: a reader (shared holder);
/// - `w`, value `shared-w`: an exclusive caller (a writer) waiting for readers: no new reader gets
///   in while one lives;
/// - `p`, value `permits=N`: a semaphore's line: the N entries with the lowest create revisions
///   hold a permit each, the others wait in that order.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    lock: Vec<u8>,
}

/// Where a key seen by a watch of `K` belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Lock,
    Entry(Tag),
    /// Another lock's key that sorts in the watched range (a name that extends this one past a
    /// NUL): waking for it is harmless.
    Other,
}

impl Keys {
    /// `prefix + name`, with each NUL byte followed by 0x7f: an entry's separator is a NUL
    /// followed by a tag, so no other lock's key (nor its entries) is an entry of this one, and
    /// the keys of the locks whose names extend this one past a NUL sort after every entry of
    /// this one (0x7f is above every tag), outside the ranges compared here. Names without NUL
    /// keep their plain key.
    pub(super) fn new(prefix: &str, name: &str) -> Self {
        Keys {
            lock: etcd_key(prefix, name).into_bytes(),
        }
    }

    pub(super) fn lock(&self) -> &[u8] {
        &self.lock
    }

    fn with(&self, tail: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.lock.len() + tail.len());
        key.extend_from_slice(&self.lock);
        key.extend_from_slice(tail);
        key
    }

    /// The token (the holder value) an entry's key ends with.
    fn token_of<'k>(&self, entry: &'k [u8]) -> Option<&'k [u8]> {
        entry.get(self.lock.len() + 3..)
    }

    pub(super) fn entry(&self, tag: Tag, token: &Token) -> Vec<u8> {
        let mut key = self.with(&[0, tag.byte(), 0]);
        key.extend_from_slice(token.as_str().as_bytes());
        key
    }

    /// The entries tagged `first` to `last` (in tag order: permit, queue, reader, writer).
    pub(super) fn range(&self, first: Tag, last: Tag) -> (Vec<u8>, Vec<u8>) {
        (
            self.with(&[0, first.byte(), 0]),
            self.with(&[0, last.byte(), 1]),
        )
    }

    /// `K` and the entries that keep an exclusive caller out (in key order: `K` first, then
    /// semaphore, fair and reader entries).
    pub(super) fn claim_range(&self) -> (Vec<u8>, Vec<u8>) {
        (self.lock.clone(), self.with(&[0, Tag::Reader.byte(), 1]))
    }

    /// `K` and every entry under it.
    pub(super) fn watch_range(&self) -> (Vec<u8>, Vec<u8>) {
        (self.lock.clone(), self.with(&[1]))
    }

    /// Every entry under `K`.
    pub(super) fn entries(&self) -> (Vec<u8>, Vec<u8>) {
        (self.with(&[0]), self.with(&[1]))
    }

    pub(super) fn part(&self, key: &[u8]) -> Part {
        let Some(tail) = key.strip_prefix(self.lock.as_slice()) else {
            return Part::Other;
        };
        let tag = match tail {
            [] => return Part::Lock,
            [0, b'p', 0, ..] => Tag::Permit,
            [0, b'q', 0, ..] => Tag::Queue,
            [0, b'r', 0, ..] => Tag::Reader,
            [0, b'w', 0, ..] => Tag::Writer,
            _ => return Part::Other,
        };
        Part::Entry(tag)
    }
}

/// The lock key `K` of the lock `name` under `prefix` (see [`Keys::new`]). NUL and 0x7f are
/// ASCII, so the key is as much UTF-8 as the name.
pub(crate) fn etcd_key(prefix: &str, name: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len());
    for c in prefix.chars().chain(name.chars()) {
        key.push(c);
        if c == '\0' {
            key.push('\u{7f}');
        }
    }
    key
}

/// The name of the lock whose key (or entry) `key` is under `prefix`: `Some` for a lock's key and
/// for the entries of its fair, shared and permit callers, which hold the lock or wait in its
/// line; `None` for a writer's waiting mark (it never holds the lock) and for keys that are no
/// lock's. Public as [`crate::layout::etcd_lock_name`].
pub(crate) fn etcd_lock_name(prefix: &str, key: &[u8]) -> Option<String> {
    let rest = key.strip_prefix(Keys::new(prefix, "").lock())?;
    // The name runs up to the first NUL that is not an escaped one (NUL 0x7f).
    let mut name = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if b == 0 && bytes.next_if_eq(&0x7f).is_none() {
            break;
        }
        name.push(b);
    }
    let name = String::from_utf8(name).ok().filter(|n| !n.is_empty())?;
    match Keys::new(prefix, &name).part(key) {
        Part::Lock | Part::Entry(Tag::Permit | Tag::Queue | Tag::Reader) => Some(name),
        Part::Entry(Tag::Writer) | Part::Other => None,
    }
}

/// True iff no key in `[start, end)` exists (etcd compares every key of a range, and the zero
/// key-value when there is none).
pub(super) fn none_in((start, end): (Vec<u8>, Vec<u8>)) -> Compare {
    Compare::create_revision(start, CompareOp::Equal, 0).with_range(end)
}

/// True iff some key in `[start, end)` exists.
fn some_in((start, end): (Vec<u8>, Vec<u8>)) -> Compare {
    Compare::create_revision(start, CompareOp::Greater, 0).with_range(end)
}

/// The first key of `[start, end)` in key order (which says what kind of lock the key is).
pub(super) fn first_in((start, end): (Vec<u8>, Vec<u8>)) -> TxnOp {
    TxnOp::get(start, Some(GetOptions::new().with_range(end).with_limit(1)))
}

/// The `limit` oldest keys of `[start, end)` (0: all), by create revision.
pub(super) fn oldest_in((start, end): (Vec<u8>, Vec<u8>), limit: i64) -> TxnOp {
    let options = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(limit);
    TxnOp::get(start, Some(options))
}

fn put(key: Vec<u8>, mode: Mode, lease: i64) -> TxnOp {
    TxnOp::put(key, value(mode), Some(PutOptions::new().with_lease(lease)))
}

/// For an exclusive caller that waits: marks it as a waiting writer on `keys` if readers still
/// hold it (no new reader gets in while the mark lives). Succeeds when it did.
pub(super) fn writer_mark(keys: &Keys, token: &Token, lease: i64) -> Txn {
    let mark = keys.entry(Tag::Writer, token);
    Txn::new()
        .when([some_in(keys.range(Tag::Reader, Tag::Reader))])
        .and_then([put(mark, Mode::Exclusive, lease)])
}

/// What an exclusive caller finds first in [`Keys::claim_range`] of a key that it did not get
/// and whose `K` is absent: `Some` when it refuses it (readers or a fair line: held; a
/// semaphore: a mismatch).
pub(super) fn exclusive_refusal(first: Option<&KeyValue>, key: &str) -> Option<Refusal> {
    let first = first?;
    if first.value().starts_with(b"permits=") {
        return Some(Refusal::Mismatch(Attempt::mismatch(
            key,
            Mode::Exclusive,
            other_of(first),
        )));
    }
    Some(Refusal::Held)
}

pub(super) enum Refusal {
    Held,
    Mismatch(Attempt),
}

/// What one attempt of a fair, shared or permit lock came to.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Granted: our entry's create revision, the fencing token.
    Granted(i64),
    /// Refused, with our entry waiting in line (its create revision), or none.
    Refused {
        waiting: Option<i64>,
    },
    /// Refused; our entry is not in line but still exists (a try-once semaphore caller behind the
    /// holders): delete it.
    Withdraw,
    Mismatch(Attempt),
}

/// The one transaction of an attempt to take `keys` in `mode` (not exclusive) for `token`, under
/// `lease`. `queue`: the caller waits if refused, so its entry stays in line.
///
/// A reader: when no `p` or `q` entry exists (else a mismatch), put its `r` entry if `K` is absent
/// and no `w` entry exists; granted if its entry exists. Fair: when no `p` or `r` entry exists, put
/// its `q` entry (a caller that does not wait only when nobody is in line and `K` is absent), then
/// read `K` and the first in line. Permits: when `K` is absent and no `q` or `r` entry exists, put
/// its `p` entry if every `p` entry there says the same N, then read the first N; a caller that
/// does not wait withdraws an entry that got no permit (one more request, see
/// [`Outcome::Withdraw`]).
pub(super) fn attempt(keys: &Keys, token: &Token, mode: Mode, queue: bool, lease: i64) -> Txn {
    let Some(tag) = Tag::of(mode) else {
        return Txn::new();
    };
    let own = keys.entry(tag, token);
    let lock = keys.lock().to_vec();
    match mode {
        // In line by create revision: the first holds it while `K` (an exclusive holder) is
        // absent. A caller that does not wait joins only a free lock with nobody in line (or
        // finds its own entry of an earlier attempt).
        Mode::Fair => {
            let join = if queue {
                Txn::new()
                    .when([Compare::create_revision(own.clone(), CompareOp::Equal, 0)])
                    .and_then([put(own.clone(), mode, lease)])
            } else {
                Txn::new()
                    .when([
                        none_in(keys.range(Tag::Queue, Tag::Queue)),
                        Compare::create_revision(lock.clone(), CompareOp::Equal, 0),
                    ])
                    .and_then([put(own.clone(), mode, lease)])
            };
            Txn::new()
                .when([
                    none_in(keys.range(Tag::Permit, Tag::Permit)),
                    none_in(keys.range(Tag::Reader, Tag::Reader)),
                ])
                .and_then([
                    TxnOp::txn(join),
                    TxnOp::get(lock, None),
                    oldest_in(keys.range(Tag::Queue, Tag::Queue), 1),
                    TxnOp::get(own, None),
                ])
                .or_else([first_in(keys.range(Tag::Permit, Tag::Reader))])
        }
        // A reader gets in while no writer holds `K` and none waits; a reader already in stays.
        Mode::Shared => {
            let enter = Txn::new()
                .when([
                    Compare::create_revision(lock, CompareOp::Equal, 0),
                    none_in(keys.range(Tag::Writer, Tag::Writer)),
                ])
                .and_then([put(own.clone(), mode, lease)]);
            Txn::new()
                .when([
                    none_in(keys.range(Tag::Permit, Tag::Permit)),
                    none_in(keys.range(Tag::Queue, Tag::Queue)),
                ])
                .and_then([TxnOp::txn(enter), TxnOp::get(own, None)])
                .or_else([first_in(keys.range(Tag::Permit, Tag::Queue))])
        }
        // In line by create revision: the first N hold a permit. The entry goes in only when
        // every other entry agrees on N.
        Mode::Permits(n) => {
            let permits = keys.range(Tag::Permit, Tag::Permit);
            let agree = Txn::new()
                .when([
                    Compare::value(permits.0.clone(), CompareOp::Equal, value(mode))
                        .with_range(permits.1.clone()),
                ])
                .and_then([put(own.clone(), mode, lease)]);
            let enter = Txn::new()
                .when([none_in(permits.clone())])
                .and_then([put(own.clone(), mode, lease)])
                .or_else([TxnOp::txn(agree)]);
            Txn::new()
                .when([
                    Compare::create_revision(lock.clone(), CompareOp::Equal, 0),
                    none_in(keys.range(Tag::Queue, Tag::Reader)),
                ])
                .and_then([
                    TxnOp::txn(enter),
                    oldest_in(permits, i64::from(n)),
                    TxnOp::get(own, None),
                ])
                .or_else([
                    TxnOp::get(lock, None),
                    first_in(keys.range(Tag::Queue, Tag::Reader)),
                ])
        }
        Mode::Exclusive => Txn::new(),
    }
}

/// Reads the answer to [`attempt`]. `Err` when etcd answered with other responses than asked.
pub(super) fn outcome(
    name: &str,
    token: &Token,
    keys: &Keys,
    mode: Mode,
    queue: bool,
    resp: &TxnResponse,
) -> Result<Outcome, &'static str> {
    let gets = super::node::ranges(resp);
    let Some(tag) = Tag::of(mode) else {
        return Err("not a kind of lock");
    };
    let own_key = keys.entry(tag, token);
    if !resp.succeeded() {
        // Used as another kind of lock: what the transaction read says which.
        let other = gets.iter().flatten().next().map_or(-1, |kv| {
            if kv.key() == keys.lock() {
                -1
            } else {
                other_of(kv)
            }
        });
        return Ok(Outcome::Mismatch(Attempt::mismatch(name, mode, other)));
    }
    match (mode, gets.as_slice()) {
        (Mode::Fair, [lock, head, own]) => {
            let Some(own) = own.first() else {
                return Ok(Outcome::Refused { waiting: None });
            };
            let first = head
                .first()
                .is_some_and(|kv| kv.key() == own_key.as_slice());
            if first && lock.is_empty() {
                Ok(Outcome::Granted(own.create_revision()))
            } else {
                Ok(Outcome::Refused {
                    waiting: Some(own.create_revision()),
                })
            }
        }
        (Mode::Shared, [own]) => Ok(match own.first() {
            Some(own) => Outcome::Granted(own.create_revision()),
            None => Outcome::Refused { waiting: None },
        }),
        (Mode::Permits(_), [holders, own]) => {
            let Some(own) = own.first() else {
                // Not let in: the entries there disagree on N.
                let other = holders.first().map_or(-1, other_of);
                return Ok(Outcome::Mismatch(Attempt::mismatch(name, mode, other)));
            };
            if holders.iter().any(|kv| kv.key() == own_key.as_slice()) {
                Ok(Outcome::Granted(own.create_revision()))
            } else if queue {
                Ok(Outcome::Refused {
                    waiting: Some(own.create_revision()),
                })
            } else {
                Ok(Outcome::Withdraw)
            }
        }
        _ => Err("unexpected responses"),
    }
}

/// What `inspect` reports of a lock: from its key `lock` (when an exclusive caller holds it)
/// and its `entries`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) fence: i64,
    pub(super) holders: usize,
    pub(super) queued: usize,
    /// The holders' leases.
    pub(super) leases: Vec<i64>,
    /// The holders' keys (what a forced release deletes).
    pub(super) keys: Vec<Vec<u8>>,
    /// The holders' owner records that could be read.
    pub(super) owners: Vec<crate::owner::Owner>,
}

pub(super) fn seen(keys: &Keys, lock: Option<&KeyValue>, entries: &[KeyValue]) -> Option<Seen> {
    let of = |tag: Tag| -> Vec<&KeyValue> {
        let mut found: Vec<&KeyValue> = entries
            .iter()
            .filter(|kv| keys.part(kv.key()) == Part::Entry(tag))
            .collect();
        found.sort_by_key(|kv| kv.create_revision());
        found
    };
    let queue = of(Tag::Queue);
    if let Some(lock) = lock {
        return Some(Seen {
            fence: lock.create_revision(),
            holders: 1,
            queued: queue.len(),
            leases: vec![lock.lease()],
            keys: vec![lock.key().to_vec()],
            owners: crate::owner::of_value(lock.value()).into_iter().collect(),
        });
    }
    let (holders, waiting) = if let Some(head) = queue.first() {
        (vec![*head], queue.len() - 1)
    } else {
        let readers = of(Tag::Reader);
        if readers.is_empty() {
            let permits = of(Tag::Permit);
            let n = permits
                .first()
                .map_or(0, |kv| usize::try_from(other_of(kv)).unwrap_or(0));
            let held = permits.len().min(n);
            (permits[..held].to_vec(), permits.len() - held)
        } else {
            (readers, 0)
        }
    };
    let fence = holders.iter().map(|kv| kv.create_revision()).max()?;
    Some(Seen {
        fence,
        holders: holders.len(),
        queued: waiting,
        leases: holders.iter().map(|kv| kv.lease()).collect(),
        keys: holders.iter().map(|kv| kv.key().to_vec()).collect(),
        owners: holders
            .iter()
            .filter_map(|kv| keys.token_of(kv.key()))
            .filter_map(crate::owner::of_value)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_lock_name_reads_back_lock_keys_and_holding_entries() {
        let token = Token::new(
            &crate::owner::Identity::new(None),
            std::time::Instant::now(),
        );
        for name in ["a", "wallet:42", "nul\0in\0\x7fit", "{t}x"] {
            let keys = Keys::new("lock:", name);
            assert_eq!(etcd_lock_name("lock:", keys.lock()).as_deref(), Some(name));
            for tag in [Tag::Permit, Tag::Queue, Tag::Reader] {
                let entry = keys.entry(tag, &token);
                assert_eq!(etcd_lock_name("lock:", &entry).as_deref(), Some(name));
            }
            assert_eq!(
                etcd_lock_name("lock:", &keys.entry(Tag::Writer, &token)),
                None
            );
            assert_eq!(etcd_lock_name("other:", keys.lock()), None);
        }
        let nul_prefix = Keys::new("p\0", "n");
        assert_eq!(
            etcd_lock_name("p\0", nul_prefix.lock()).as_deref(),
            Some("n")
        );
        for stray in [
            &b"lock:"[..],
            b"lock:a\0x",
            b"lock:a\0r",
            b"lock:\xff",
            b"unrelated",
        ] {
            assert_eq!(etcd_lock_name("lock:", stray), None, "{stray:?}");
        }
    }

    #[test]
    fn entries_sort_under_their_lock_and_nothing_else_does() {
        let token = Token::new(
            &crate::owner::Identity::new(None),
            std::time::Instant::now(),
        );
        let keys = Keys::new("lock:", "a");
        assert_eq!(keys.lock(), b"lock:a");
        let entry = keys.entry(Tag::Reader, &token);
        assert_eq!(keys.part(&entry), Part::Entry(Tag::Reader));
        assert_eq!(keys.token_of(&entry), Some(token.as_str().as_bytes()));
        assert_eq!(keys.part(keys.lock()), Part::Lock);
        let (start, end) = keys.range(Tag::Permit, Tag::Reader);
        assert!(start.as_slice() <= entry.as_slice() && entry.as_slice() < end.as_slice());
        let writer = keys.entry(Tag::Writer, &token);
        assert!(writer.as_slice() >= end.as_slice());
        let (start, end) = keys.watch_range();
        for key in [keys.lock(), &entry, &writer] {
            assert!(start.as_slice() <= key && key < end.as_slice());
        }
        // A name that looks like an entry of `a` is another key, outside `a`'s ranges.
        let tricky = Keys::new("lock:", &format!("a\0r\0{}", token.as_str()));
        assert_ne!(tricky.lock(), entry.as_slice());
        assert_eq!(keys.part(tricky.lock()), Part::Other);
        let (start, end) = keys.entries();
        let (first, last) = keys.range(Tag::Permit, Tag::Writer);
        assert!(start <= first && last <= end);
        assert!(!(first.as_slice() <= tricky.lock() && tricky.lock() < last.as_slice()));
        // A name that extends this one past a NUL sorts after every entry of this one.
        let longer = Keys::new("lock:", "a\0p");
        assert!(longer.lock() > writer.as_slice());
        assert_eq!(keys.part(longer.lock()), Part::Other);
        let (_, claim_end) = keys.claim_range();
        assert!(longer.lock() >= claim_end.as_slice());
    }
}
