//! [`Keyspace`]: the one layout of every Redis key Tollgate writes — a prefix, a hash tag in
//! braces, then parts — and its inverse.
//!
//! Redis Cluster runs a script or a pipeline only on keys of one slot, and hashes only what is
//! between the first `{` and the next `}`. So every key one call touches is written here with the
//! same tag, and nowhere else is a brace placed around a tag.
//!
//! The layout is what deployed keys already use (counters, limiter state, semaphores, queues live
//! under these names), so it is pinned by tests: a change here orphans every stored key.

use std::fmt::Write as _;

/// Where a family of Redis keys lives: `{prefix}{<tag>}:<name>[:<len>:<value>]...`.
///
/// - The **prefix** separates one user of a Redis from another; it is written as given (with its
///   own trailing separator, if any: `"rl:"`).
/// - The **tag** is the Redis Cluster hash tag: keys with the same tag are on one node, so one
///   script can touch them all.
/// - The **name** says what the key holds; the program chooses it, and it has no `:`.
/// - Each **value** (what a request carries: a user, an IP) is written with its length in
///   front, so no value can end early and forge another key: two different (name, values) lists
///   under one tag never give the same key, whatever the values contain, and [`Keyspace::parse`]
///   gets them back.
///
/// ```
/// use tollgate_redis::Keyspace;
/// let counters = Keyspace::new("rl:");
/// let key = counters.key("api", "per-user", &["alice:1", ""]);
/// assert_eq!(key, "rl:{api}:per-user:7:alice:1:0:");
/// assert_eq!(counters.parse("api", &key), Some(("per-user", vec!["alice:1", ""])));
/// assert_eq!(counters.pattern("a*"), "rl:{a\\*}:*");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Keyspace {
    prefix: String,
}

impl Keyspace {
    /// Keys starting with `prefix`, written as given.
    pub fn new(prefix: impl Into<String>) -> Keyspace {
        Keyspace { prefix: prefix.into() }
    }

    /// What every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether `tag` is hashed whole by Redis Cluster: non-empty, without `{` or `}`. A tag that
    /// is not still keeps its keys together (Cluster hashes the same part of each), but a name
    /// that must be one slot on its own (a semaphore, a queue) is refused with it.
    ///
    /// ```
    /// use tollgate_redis::Keyspace;
    /// assert!(Keyspace::is_whole_tag("orders"));
    /// assert!(!Keyspace::is_whole_tag("") && !Keyspace::is_whole_tag("a}b"));
    /// ```
    pub fn is_whole_tag(tag: &str) -> bool {
        !tag.is_empty() && !tag.contains(['{', '}'])
    }

    /// The key that is the tag alone: `{prefix}{<tag>}` (a queue's stream).
    pub fn tag_key(&self, tag: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + 3);
        self.write_tag(&mut key, tag);
        key
    }

    /// What every key with parts under `tag` starts with: `{prefix}{<tag>}:`.
    pub fn head(&self, tag: &str) -> String {
        let mut key = self.tag_key(tag);
        key.push(':');
        key
    }

    /// The key `name` with `values` under `tag`: `{prefix}{<tag>}:<name>`, then `:<len>:<value>`
    /// for each value (its length in bytes, in decimal).
    pub fn key<V: AsRef<str>>(&self, tag: &str, name: &str, values: &[V]) -> String {
        debug_assert!(!name.contains(':'), "a key's name {name:?} has no ':' (it ends at the first)");
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + name.len() + 4 + 8 * values.len());
        self.write_tag(&mut key, tag);
        key.push(':');
        key.push_str(name);
        for value in values {
            let value = value.as_ref();
            let _ = write!(key, ":{}:{value}", value.len());
        }
        key
    }

    /// `{prefix}{<tag>}` then `:<part>` for each part, written as given — [`RedisLimiter`]'s
    /// layout, deployed before this one: its parts are its limit names and the caller's keys,
    /// which may hold `:`, so two part lists can give one key, and none can be parsed back. New
    /// layouts use [`Keyspace::key`].
    ///
    /// [`RedisLimiter`]: crate::RedisLimiter
    pub fn plain_key(&self, tag: &str, parts: &[&str]) -> String {
        let mut key =
            Vec::with_capacity(self.prefix.len() + tag.len() + 3 + parts.iter().map(|p| p.len() + 1).sum::<usize>());
        self.push_plain_key(&mut key, tag, parts);
        String::from_utf8(key).expect("written from &strs")
    }

    /// [`Keyspace::plain_key`], appended to `out` as bytes (a call's words, without a `String`
    /// of its own).
    pub(crate) fn push_plain_key(&self, out: &mut Vec<u8>, tag: &str, parts: &[&str]) {
        out.extend_from_slice(self.prefix.as_bytes());
        out.push(b'{');
        out.extend_from_slice(tag.as_bytes());
        out.push(b'}');
        for part in parts {
            out.push(b':');
            out.extend_from_slice(part.as_bytes());
        }
    }

    /// The name and values of a key [`Keyspace::key`] made under `tag`; `None` for a key of another
    /// prefix or tag, or one not in this layout.
    pub fn parse<'k>(&self, tag: &str, key: &'k str) -> Option<(&'k str, Vec<&'k str>)> {
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix('{')?.strip_prefix(tag)?;
        let rest = rest.strip_prefix("}:")?;
        let (name, mut rest) = rest.split_at(rest.find(':').unwrap_or(rest.len()));
        let mut values = Vec::new();
        while !rest.is_empty() {
            let (len, after) = rest.strip_prefix(':')?.split_once(':')?;
            // Digits only: `parse` would also take a sign.
            if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let len: usize = len.parse().ok()?;
            values.push(after.get(..len)?);
            rest = &after[len..];
        }
        Some((name, values))
    }

    /// The SCAN `MATCH` pattern of every key with parts under `tag` (the prefix and tag matched
    /// literally, whatever glob characters they hold).
    pub fn pattern(&self, tag: &str) -> String {
        let mut pattern = glob_escape(&self.head(tag));
        pattern.push('*');
        pattern
    }

    fn write_tag(&self, key: &mut String, tag: &str) {
        key.push_str(&self.prefix);
        key.push('{');
        key.push_str(tag);
        key.push('}');
    }
}

/// `text` with Redis glob characters (`*?[]\`) escaped, to match it literally.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Text rich in what the layout uses: separators, braces, glob characters, digits.
    fn part() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[:{}*?\\[\\]\\\\0-9aé ]{0,12}").unwrap()
    }

    fn name() -> impl Strategy<Value = String> {
        proptest::string::string_regex("[{}*0-9a-f-]{0,8}").unwrap()
    }

    proptest! {
        #[test]
        fn a_key_parses_back_to_its_name_and_values(
            prefix in part(), tag in part(), name in name(), values in proptest::collection::vec(part(), 0..5)
        ) {
            let space = Keyspace::new(prefix);
            let key = space.key(&tag, &name, &values);
            let (got_name, got_values) = space.parse(&tag, &key).expect("a key of this layout parses");
            prop_assert_eq!(got_name, name.as_str());
            prop_assert_eq!(got_values, values.iter().map(String::as_str).collect::<Vec<_>>());
            prop_assert!(key.starts_with(&space.head(&tag)));
        }

        #[test]
        fn different_names_or_values_never_give_one_key(
            tag in part(),
            a in (name(), proptest::collection::vec(part(), 0..4)),
            b in (name(), proptest::collection::vec(part(), 0..4)),
        ) {
            let space = Keyspace::new("p:");
            if a != b {
                prop_assert_ne!(space.key(&tag, &a.0, &a.1), space.key(&tag, &b.0, &b.1));
            }
        }
    }

    #[test]
    fn keys_of_each_layout_are_the_deployed_ones() {
        // The server's counters (`--storage redis*`): limit id, then the variables' values.
        let server = Keyspace::new("tollgate:");
        assert_eq!(
            server.key("ns:{x}", "00000000000000ff", &["a:1:b", "", "12"]),
            "tollgate:{ns:{x}}:00000000000000ff:5:a:1:b:0::2:12"
        );
        assert_eq!(server.head("ns"), "tollgate:{ns}:");
        // RedisLimiter: `{prefix}:{<tag>}:<limit>[:<key>]`.
        let limiter = Keyspace::new("api:");
        assert_eq!(limiter.plain_key("user:42", &["per-user"]), "api:{user:42}:per-user");
        assert_eq!(limiter.plain_key("acme", &["per-user", "user:42"]), "api:{acme}:per-user:user:42");
        // RedisSemaphore and the pace queue.
        assert_eq!(
            Keyspace::new("tollgate:semaphore:").key("db", "holders", &[] as &[&str]),
            "tollgate:semaphore:{db}:holders"
        );
        assert_eq!(Keyspace::new("").tag_key("orders"), "{orders}");
        assert_eq!(Keyspace::new("").key("orders", "dead", &[] as &[&str]), "{orders}:dead");
    }

    #[test]
    fn keys_of_other_layouts_do_not_parse() {
        let space = Keyspace::new("rl:");
        for bad in ["id:3:ab", "id:x:ab", "id:-1:", "id:+1:a", "id:1", "id::a"] {
            assert_eq!(space.parse("ns", &format!("rl:{{ns}}:{bad}")), None, "{bad}");
        }
        assert_eq!(space.parse("ns", "other:{ns}:id"), None);
        assert_eq!(space.parse("ns", "rl:{ns2}:id"), None);
        assert_eq!(space.parse("ns", "rl:{ns}"), None);
        assert_eq!(space.parse("ns", "rl:{ns}:id"), Some(("id", vec![])));
    }

    #[test]
    fn the_pattern_matches_the_head_literally() {
        assert_eq!(Keyspace::new("rl:").pattern("a*b"), "rl:{a\\*b}:*");
        assert_eq!(Keyspace::new("[x]\\").pattern("?"), "\\[x\\]\\\\{\\?}:*");
    }
}
