//! The key layout of a lock on Redis: its lock key, release channel and fair queue, all in one
//! Cluster slot, the way back from a key to its lock's name, and the fence counters (one per
//! server, or one per slot on a Cluster).

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::backend::cluster::key_slot;

/// The Redis lock key and release channel of the lock `name` under `prefix`, in that order.
///
/// The layout is injective: no two names (and no name and kind) share a key, whatever braces the
/// names contain. Both carry one Redis Cluster hash tag, so they live in one slot:
/// - a name without a hash tag is escaped (`%` -> `%25`, `{` -> `%7B`, `}` -> `%7D`) and wrapped
///   in braces: `lock:{wallet:42}`, `lock:{wallet:42}:released`;
/// - a name with a hash tag `{t}` keeps `t` as the tag, so names that share a tag share a slot,
///   followed by `=` and the escaped name: `lock:{t}=a:%7Bt%7D`, `lock:{t}:released=a:%7Bt%7D`.
///
/// The part after the first `}` tells the two apart: it is exactly `""` or `:released` (or, for
/// fair locks, `:queue` and `:queue-leases`) without a tag, and carries an `=` with one.
/// The public side of this layout is [`crate::layout`].
pub(crate) fn redis_keys(prefix: &str, name: &str) -> [String; 2] {
    let keys = LockKeys::new(prefix, name);
    [KeyKind::Lock, KeyKind::Released].map(|kind| keys.of(kind))
}

/// The fence counter of a server (a single node, a Sentinel master, each Redlock node): one key,
/// `<prefix>fence`, for every lock under `prefix`. No lock's key is it: those have a `{` right
/// after the prefix.
pub(crate) fn server_fence_key(prefix: &str) -> String {
    [prefix, "fence"].concat()
}

/// The fence counter of the Cluster hash slot that the lock `name` under `prefix` lives in:
/// `<prefix>fence{<n>}`, where `<n>` is the smallest number whose decimal digits hash to that
/// slot, so the counter shares the slot with the lock's keys (one script reaches both) and every
/// lock in the slot counts on it. At most 16,384 counters, however many names.
pub(crate) fn slot_fence_key(prefix: &str, name: &str) -> String {
    let lock = LockKeys::new(prefix, name).of(KeyKind::Lock);
    let slot = key_slot(&lock);
    format!("{prefix}fence{{{}}}", SLOT_TAGS[usize::from(slot)])
}

/// Per Cluster hash slot, the smallest number whose decimal digits hash to it (all 16,384 are
/// found below 110,000: a few milliseconds, once).
static SLOT_TAGS: LazyLock<Box<[u32]>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; SLOTS];
    let mut left = SLOTS;
    let mut n = 0u32;
    while left > 0 {
        let slot = usize::from(key_slot(&n.to_string()));
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            left -= 1;
        }
        n += 1;
    }
    tags.into_boxed_slice()
});

/// How many hash slots a Redis Cluster has.
const SLOTS: usize = 16_384;

/// The Redis key (or channel) of `kind` of the lock `name` under `prefix` (see [`redis_keys`]).
pub(crate) fn redis_key(prefix: &str, name: &str, kind: KeyKind) -> String {
    LockKeys::new(prefix, name).of(kind)
}

/// What every key of one lock shares, so that the name is escaped once for all of them:
/// `prefix{tag}` before the kind's suffix, and `=escaped-name` after it (nothing when the name
/// is its own tag). Borrowed from the prefix and the name: a name with nothing to escape and no
/// tag of its own (the common case) costs no allocation until a key is made a `String`.
pub(crate) struct LockKeys<'a> {
    prefix: &'a str,
    escaped: Cow<'a, str>,
    /// The name's own hash tag, if it has one.
    tag: Option<&'a str>,
}

impl<'a> LockKeys<'a> {
    pub(crate) fn new(prefix: &'a str, name: &'a str) -> LockKeys<'a> {
        LockKeys {
            prefix,
            escaped: escape(name),
            tag: hash_tag(name),
        }
    }

    /// The parts of the key of `kind`, in order.
    fn parts(&self, kind: KeyKind) -> [&str; 7] {
        match self.tag {
            Some(tag) => [
                self.prefix,
                "{",
                tag,
                "}",
                kind.suffix(),
                "=",
                &self.escaped,
            ],
            None => [self.prefix, "{", &self.escaped, "}", kind.suffix(), "", ""],
        }
    }

    /// The key (or channel) of `kind`.
    pub(crate) fn of(&self, kind: KeyKind) -> String {
        self.parts(kind).concat()
    }

    /// The key (or channel) of `kind` as a command argument, written into the command in place
    /// (no `String` of its own).
    pub(crate) fn arg(&self, kind: KeyKind) -> KeyArg<'_> {
        KeyArg { keys: self, kind }
    }
}

/// See [`LockKeys::arg`].
pub(crate) struct KeyArg<'a> {
    keys: &'a LockKeys<'a>,
    kind: KeyKind,
}

impl KeyArg<'_> {
    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.keys
            .parts(self.kind)
            .iter()
            .map(|part| part.len())
            .sum()
    }
}

impl redis::ToRedisArgs for KeyArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's buffer: they cannot fail.
        for part in self.keys.parts(self.kind) {
            let _ = arg.write_all(part.as_bytes());
        }
    }
}

/// One of a lock's Redis keys (or its release channel): what
/// [`redis_key`](crate::layout::redis_key) makes and
/// [`redis_lock_name`](crate::layout::redis_lock_name) reads back. The
/// [module documentation](crate::layout#redis) shows each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyKind {
    /// The lock key itself (`lock:{wallet:42}`): an exclusive or fair lock's holder, a shared
    /// lock's or semaphore's holders.
    Lock,
    /// The release channel (`lock:{wallet:42}:released`): a pub/sub channel, not a key.
    Released,
    /// A fair lock's waiters, scored by ticket (arrival) (`lock:{wallet:42}:queue`).
    Queue,
    /// A fair lock's waiters, scored by the expiry of their entry's lease
    /// (`lock:{wallet:42}:queue-leases`).
    QueueLeases,
    /// That someone waits for the lock (`lock:{wallet:42}:waiting`, a string with a time to
    /// live): set by a waiter's refused attempt, deleted by the release that frees the lock,
    /// which only then looks at the queue or announces itself.
    Waiting,
}

impl KeyKind {
    fn suffix(self) -> &'static str {
        match self {
            KeyKind::Lock => "",
            KeyKind::Released => ":released",
            KeyKind::Queue => ":queue",
            KeyKind::QueueLeases => ":queue-leases",
            KeyKind::Waiting => ":waiting",
        }
    }
}

/// The channel a waiter listens on: the lock's release `channel`, or with `own` (a waiter's
/// token digest, see `Node::watch`) that waiter's own, `<channel>{<16 hex digits>}`, which only a
/// release that hands the lock to it publishes on (see `scripts::HAND_TO_HEAD`). It keeps the
/// channel's hash tag (the first braces), so a cluster publishes it from the lock's shard, and
/// it is no lock's release channel: those never end in `}` ([`lock_name_of`] reads both back).
pub(crate) fn own_channel(channel: String, own: Option<u64>) -> String {
    match own {
        Some(digest) => format!("{channel}{{{digest:016x}}}"),
        None => channel,
    }
}

/// The lock name whose Redis key (or channel) of `kind` under `prefix` is `key`: the inverse of
/// [`redis_keys`]; for [`KeyKind::Released`] also of a queued waiter's own channel (see
/// [`own_channel`]), which is the release channel followed by 16 hex digits in braces (no
/// release channel ends in `}`). `None` for anything else.
pub(crate) fn lock_name_of(prefix: &str, key: &str, kind: KeyKind) -> Option<String> {
    let key = match (kind, key.strip_suffix('}')) {
        (KeyKind::Released, Some(own)) => {
            let (channel, digest) = own.split_at_checked(own.len().checked_sub(17)?)?;
            let digest = digest.strip_prefix('{')?;
            digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                .then_some(channel)?
        }
        _ => key,
    };
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (inner, after) = (&rest[..close], &rest[close + 1..]);
    let after = after.strip_prefix(kind.suffix())?;
    let name = if after.is_empty() {
        unescape(inner)?
    } else {
        unescape(after.strip_prefix('=')?)?
    };
    (redis_key(prefix, &name, kind) == key).then_some(name)
}

fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let (code, tail) = (rest.get(i + 1..i + 3)?, &rest[i + 3..]);
        out.push(match code {
            "25" => '%',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = tail;
    }
    out.push_str(rest);
    Some(out)
}

/// The part of `key` Redis Cluster hashes when it has a hash tag: the text between the first `{`
/// and the next `}`, when not empty.
pub(in crate::backend) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

fn escape(name: &str) -> Cow<'_, str> {
    if !name.contains(['%', '{', '}']) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let keys = |name: &str| redis_keys("lock:", name);
        assert_eq!(
            keys("wallet:42"),
            ["lock:{wallet:42}", "lock:{wallet:42}:released"]
        );
        assert_eq!(keys("a{t}b")[0], "lock:{t}=a%7Bt%7Db");
        assert_eq!(keys("a{t}b")[1], "lock:{t}:released=a%7Bt%7Db");
        assert_eq!(keys("odd{}")[0], "lock:{odd%7B%7D}");
    }

    #[test]
    fn a_key_written_as_an_argument_is_the_key() {
        for name in ["wallet:42", "a{t}b", "odd{}", "%"] {
            let keys = LockKeys::new("lock:", name);
            for kind in [
                KeyKind::Lock,
                KeyKind::Released,
                KeyKind::Queue,
                KeyKind::QueueLeases,
                KeyKind::Waiting,
            ] {
                let arg = keys.arg(kind);
                let written = redis::ToRedisArgs::to_redis_args(&arg);
                assert_eq!(written, vec![keys.of(kind).into_bytes()], "{name} {kind:?}");
                assert_eq!(arg.len(), keys.of(kind).len());
            }
        }
    }

    #[test]
    fn key_layout_is_injective() {
        let names = [
            "x",
            "{x}",
            "{x}:fence",
            "{x}:released",
            "x:fence",
            "x}",
            "{x",
            "%7Bx%7D",
            "x=",
            "{x}=",
            "{x}=%7Bx%7D",
            "a{x}",
            "{x}a",
            "",
            "{}",
            "{{x}",
            "%",
            "%25",
            "x:released",
            "{y}:fence",
            "y",
            "{x}:waiting",
            "x:waiting",
            "{x}:queue",
            // Names that end as a waiter's own channel does.
            "x:released{0123456789abcdef}",
            "{x}:released{0123456789abcdef}",
            "x{0123456789abcdef}",
            "{x}{0123456789abcdef}",
        ];
        let mut seen = std::collections::HashMap::new();
        for name in names {
            let [lock, released] = keys_of(name);
            let own = own_channel(released.clone(), Some(0x0123_4567_89ab_cdef));
            let fences = [server_fence_key("lock:"), slot_fence_key("lock:", name)];
            let [queue, leases, waiting] = [KeyKind::Queue, KeyKind::QueueLeases, KeyKind::Waiting]
                .map(|kind| LockKeys::new("lock:", name).of(kind));
            let all = [lock, released, own, queue, leases, waiting];
            for (kind, key) in all.into_iter().enumerate() {
                assert!(!fences.contains(&key), "{key} is a fence counter");
                if let Some(other) = seen.insert(key.clone(), (name, kind)) {
                    panic!("{key} is both {other:?} and {:?}", (name, kind));
                }
            }
        }
    }

    fn keys_of(name: &str) -> [String; 2] {
        redis_keys("lock:", name)
    }

    #[test]
    fn names_read_back_from_their_keys() {
        for name in [
            "wallet:42",
            "a{t}b",
            "{x}",
            "a}b",
            "{{x}",
            "x{}",
            "%",
            "x=y",
            "{x}:fence",
        ] {
            let keys = redis_keys("lock:", name);
            for (kind, key) in [KeyKind::Lock, KeyKind::Released].into_iter().zip(&keys) {
                assert_eq!(
                    lock_name_of("lock:", key, kind).as_deref(),
                    Some(name),
                    "{key}"
                );
            }
            let own = own_channel(keys[1].clone(), Some(u64::MAX));
            assert_eq!(
                lock_name_of("lock:", &own, KeyKind::Released).as_deref(),
                Some(name),
                "{own}"
            );
            assert_eq!(hash_tag(&own), hash_tag(&keys[0]), "{own}");
            assert_eq!(lock_name_of("lock:", &own, KeyKind::Lock), None, "{own}");
            assert_eq!(
                lock_name_of("lock:", &keys[1], KeyKind::Lock),
                None,
                "{name}"
            );
            for fence in [server_fence_key("lock:"), slot_fence_key("lock:", name)] {
                assert_eq!(
                    lock_name_of("lock:", &fence, KeyKind::Lock),
                    None,
                    "{fence}"
                );
            }
            assert_eq!(
                lock_name_of("other:", &keys[0], KeyKind::Lock),
                None,
                "{name}"
            );
        }
        assert_eq!(lock_name_of("lock:", "lock:{a%zz}", KeyKind::Lock), None);
        for not_own in [
            "lock:{x}:released{0123}",
            "lock:{x}:released{0123456789abcdeg}",
        ] {
            assert_eq!(lock_name_of("lock:", not_own, KeyKind::Released), None);
        }
        assert_eq!(lock_name_of("lock:", "unrelated", KeyKind::Lock), None);
    }

    #[test]
    fn a_locks_keys_and_its_slots_fence_counter_share_a_slot() {
        for name in ["wallet:42", "a{t}b", "{x}", "a}b", "{{x}", "x{}"] {
            let keys = redis_keys("lock:", name);
            let tags: Vec<_> = keys.iter().map(|k| hash_tag(k)).collect();
            assert!(tags[0].is_some(), "{name}: {keys:?}");
            assert!(tags.iter().all(|t| *t == tags[0]), "{name}: {keys:?}");
            let fence = slot_fence_key("lock:", name);
            assert_eq!(key_slot(&fence), key_slot(&keys[0]), "{name}: {fence}");
        }
        assert_eq!(hash_tag(&redis_keys("lock:", "a{t}b")[0]), Some("t"));
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        assert!(SLOT_TAGS.iter().all(|t| *t < 110_000));
        for (slot, tag) in SLOT_TAGS.iter().enumerate().step_by(997) {
            assert_eq!(usize::from(key_slot(&tag.to_string())), slot);
        }
    }
}
