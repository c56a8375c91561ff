//! Where counters live ([`StorageKind`]), and which limits each storage can count.

use tollgate_policy::{AlgorithmKind, Enforcement, Policy, Position};

/// Where an engine keeps its counters, as `--storage` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageKind {
    /// In the engine's own counters (`memory`).
    Memory,
    /// In Redis, one round trip per call (`redis`).
    Redis,
    /// Decided in memory, flushed to Redis in batches (`redis-cached`).
    RedisCached,
    /// In Redis, spent from slices leased to this process (`redis-leased`).
    RedisLeased,
}

impl StorageKind {
    /// The name `--storage` takes.
    pub fn name(self) -> &'static str {
        match self {
            StorageKind::Memory => "memory",
            StorageKind::Redis => "redis",
            StorageKind::RedisCached => "redis-cached",
            StorageKind::RedisLeased => "redis-leased",
        }
    }

    /// True when the storage charges the limits that [count past](tollgate_policy::Limit::counts_past)
    /// their limit, whatever a request's outcome (memory and `redis`): the storages with local
    /// copies refuse pooled limits and count a shadow limit's admitted hits, up to its limit.
    pub fn counts_past(self) -> bool {
        matches!(self, StorageKind::Memory | StorageKind::Redis)
    }

    /// The first limit of `policy` this storage cannot count, as the error that names it. Memory
    /// counts every algorithm the limits file takes; Redis those whose
    /// [`support`](tollgate::AlgorithmKind::support) says `redis_counters`; `redis-cached` and
    /// `redis-leased` no calendar windows besides (their local copies count windows that open at a
    /// first hit); and Redis no `max_value` above [`REDIS_MAX_VALUE`]. So only memory and `redis`
    /// count envoy/ratelimit's rules, and the limits [set by
    /// requests](tollgate_policy::Limit::set_by_request) that come with them (calendar windows).
    ///
    /// ```
    /// use tollgate_policy::Policy;
    /// use tollgate_server::serve::StorageKind;
    ///
    /// let policy = Policy::parse("- {namespace: api, max_value: 5, seconds: 60, algorithm: token_bucket}", "limits.yaml")?;
    /// assert!(StorageKind::Memory.accepts(&policy).is_ok());
    /// let refused = StorageKind::Redis.accepts(&policy).unwrap_err();
    /// assert_eq!(refused.position.line, 1);
    /// # Ok::<(), tollgate_policy::PolicyError>(())
    /// ```
    pub fn accepts(self, policy: &Policy) -> Result<(), StorageError> {
        let cached = match self {
            StorageKind::Memory => return Ok(()),
            StorageKind::Redis => false,
            StorageKind::RedisCached | StorageKind::RedisLeased => true,
        };
        let refused = policy.limits().iter().filter(|l| !l.unlimited()).find_map(|l| {
            if !l.algorithm().support().redis_counters {
                Some((l, Refused::Algorithm))
            } else if cached && l.calendar().is_some() {
                Some((l, Refused::Calendar))
            } else if cached && l.enforcement() == Enforcement::Pooled {
                Some((l, Refused::Pooled))
            } else if l.max_value() > REDIS_MAX_VALUE {
                Some((l, Refused::MaxValue))
            } else {
                None
            }
        });
        match refused {
            Some((limit, refused)) => Err(StorageError {
                source_name: limit.source_name().to_owned(),
                position: limit.position(),
                namespace: limit.namespace().to_owned(),
                name: limit.name().map(str::to_owned),
                algorithm: limit.algorithm(),
                refused,
                storage: self,
            }),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for StorageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The largest `max_value` counted in Redis: 2<sup>53</sup>, the largest whole number Redis's Lua
/// (whose numbers are doubles) holds exactly.
pub const REDIS_MAX_VALUE: u64 = 1 << 53;

/// Why a storage cannot count a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its algorithm is not counted there.
    Algorithm,
    /// Its calendar window is not (the storage's windows open at a first hit).
    Calendar,
    /// Its `max_value` is above [`REDIS_MAX_VALUE`].
    MaxValue,
    /// It is [pooled](Enforcement::Pooled): whether a request is denied depends on every pooled
    /// counter it touches, which a replica's local copies cannot tell.
    Pooled,
}

/// A limit the engine's storage cannot count: which limit (position, namespace, name), which
/// algorithm it asks for, and which storage refused it. Counters in Redis are fixed windows only,
/// and `redis-cached` counts no calendar windows.
///
/// ```
/// use tollgate_policy::{AlgorithmKind, Position};
/// use tollgate_server::serve::{Refused, StorageError, StorageKind};
///
/// let err = StorageError {
///     source_name: "limits.yaml".into(),
///     position: Position::new(3, 3),
///     namespace: "api".into(),
///     name: Some("per-user".into()),
///     algorithm: AlgorithmKind::TokenBucket,
///     refused: Refused::Algorithm,
///     storage: StorageKind::Redis,
/// };
/// assert_eq!(
///     err.to_string(),
///     "line 3: algorithm token_bucket is not available with --storage redis (fixed_window only): \
///      limit `per-user` of namespace `api`"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct StorageError {
    /// The file the limit is in.
    pub source_name: String,
    /// Where the limit starts in its file.
    pub position: Position,
    /// The limit's namespace.
    pub namespace: String,
    /// The limit's name, if it has one.
    pub name: Option<String>,
    /// The algorithm the limit asks for.
    pub algorithm: AlgorithmKind,
    /// What the storage cannot count.
    pub refused: Refused,
    /// The storage that cannot count it.
    pub storage: StorageKind,
}

impl StorageError {
    /// The same message without the leading `line N: ` (for callers that print the position
    /// themselves, as `file:line:column: message`).
    pub fn message(&self) -> String {
        let limit = match &self.name {
            Some(name) => format!("limit `{name}` of namespace `{}`", self.namespace),
            None => format!("limit of namespace `{}`", self.namespace),
        };
        match self.refused {
            Refused::Algorithm => {}
            Refused::Calendar => {
                return format!(
                    "calendar windows are not available with --storage {} (windows opened by the first hit only): \
                     {limit}",
                    self.storage
                );
            }
            Refused::Pooled => {
                return format!(
                    "`mode: pooled` (envoy/ratelimit's quota_mode) is not available with --storage {} (use memory or \
                     redis): {limit}",
                    self.storage
                );
            }
            Refused::MaxValue => {
                return format!(
                    "max_value above {REDIS_MAX_VALUE} (2^53, what Redis's Lua numbers hold exactly) is not available \
                     with --storage {}: {limit}",
                    self.storage
                );
            }
        }
        format!(
            "algorithm {} is not available with --storage {} ({} only): {limit}",
            self.algorithm.name(),
            self.storage,
            AlgorithmKind::names_where(|s| s.redis_counters),
        )
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.position.line, self.message())
    }
}
