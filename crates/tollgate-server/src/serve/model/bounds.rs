//! How large a request may be: the sizes of its descriptors, checked before anything is decided
//! or stored, so that no client can make the server keep more than it chose to.
//!
//! Every counter keeps the values of its limit's variables, so without a bound on them a client
//! sending a new 1 MB value per call would grow the counter tables by a megabyte a call. The
//! bounds here refuse such requests (HTTP 400, gRPC `INVALID_ARGUMENT`, counted in
//! `tollgate_requests_refused_total{bound}`); the counter tables' byte budget
//! ([`super::CounterCap::max_bytes`]) bounds what the accepted ones keep. The defaults are far
//! above what Envoy sends (its descriptors are a few short entries) and Limitador's HTTP calls.

/// The bounds on one request's descriptors (`--max-value-bytes`, `--max-request-bytes`,
/// `--max-entries`, `--max-descriptors`).
///
/// ```
/// use tollgate_policy::Descriptor;
/// use tollgate_server::serve::{Bound, RequestBounds};
///
/// let bounds = RequestBounds::default();
/// assert!(bounds.check("api", &[Descriptor::from([("user", "alice")])]).is_ok());
/// let huge = "x".repeat(bounds.max_value_bytes + 1);
/// let err = bounds.check("api", &[Descriptor::from([("user", huge.as_str())])]).unwrap_err();
/// assert_eq!(err.bound, Bound::ValueBytes);
/// assert_eq!(err.to_string(), "descriptor 0, entry `user`: a value of 4097 bytes, over --max-value-bytes (4096)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestBounds {
    /// Most bytes in one entry's key or value.
    pub max_value_bytes: usize,
    /// Most bytes in the namespace and every entry's key and value together.
    pub max_request_bytes: usize,
    /// Most entries in one descriptor.
    pub max_entries: usize,
    /// Most descriptors in one request.
    pub max_descriptors: usize,
}

impl Default for RequestBounds {
    fn default() -> RequestBounds {
        RequestBounds { max_value_bytes: 4096, max_request_bytes: 65_536, max_entries: 64, max_descriptors: 64 }
    }
}

/// Which of the [`RequestBounds`] a request went over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bound {
    /// [`RequestBounds::max_value_bytes`].
    ValueBytes,
    /// [`RequestBounds::max_request_bytes`].
    RequestBytes,
    /// [`RequestBounds::max_entries`].
    Entries,
    /// [`RequestBounds::max_descriptors`].
    Descriptors,
}

impl Bound {
    /// Every bound, in the order the `tollgate_requests_refused_total` series are listed.
    pub const ALL: [Bound; 4] = [Bound::ValueBytes, Bound::RequestBytes, Bound::Entries, Bound::Descriptors];

    /// The label of `tollgate_requests_refused_total{bound}`: `value_bytes`, `request_bytes`,
    /// `entries` or `descriptors`.
    pub fn name(self) -> &'static str {
        match self {
            Bound::ValueBytes => "value_bytes",
            Bound::RequestBytes => "request_bytes",
            Bound::Entries => "entries",
            Bound::Descriptors => "descriptors",
        }
    }

    /// The `tollgate serve` option that sets it.
    pub fn option(self) -> &'static str {
        match self {
            Bound::ValueBytes => "--max-value-bytes",
            Bound::RequestBytes => "--max-request-bytes",
            Bound::Entries => "--max-entries",
            Bound::Descriptors => "--max-descriptors",
        }
    }
}

/// A request over one of the [`RequestBounds`]: which, where, and by how much. Its message says
/// all three, and never repeats the oversized text itself (a key is shown cut to 64 bytes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{at}{size} {what}, over {} ({max})", bound.option())]
pub struct Oversize {
    /// The bound.
    pub bound: Bound,
    /// The request's size by that bound.
    pub size: usize,
    /// The bound's value.
    pub max: usize,
    /// Where in the request (`descriptor 0, entry `user`: a value of`), ending where the size goes.
    at: String,
    /// What the size counts (`bytes`, `entries`, `descriptors`).
    what: &'static str,
}

/// Keys are shown in messages cut to this many bytes.
const SHOWN: usize = 64;

impl RequestBounds {
    /// Checks one request's namespace and descriptors against the bounds; the error names the
    /// first bound it went over and where.
    pub fn check(&self, namespace: &str, descriptors: &[tollgate_policy::Descriptor]) -> Result<(), Oversize> {
        let over = |bound, size, max, at: String, what| Oversize { bound, size, max, at, what };
        if descriptors.len() > self.max_descriptors {
            return Err(over(
                Bound::Descriptors,
                descriptors.len(),
                self.max_descriptors,
                String::new(),
                "descriptors",
            ));
        }
        let mut total = namespace.len();
        for (i, d) in descriptors.iter().enumerate() {
            if d.entries.len() > self.max_entries {
                return Err(over(
                    Bound::Entries,
                    d.entries.len(),
                    self.max_entries,
                    format!("descriptor {i}: "),
                    "entries",
                ));
            }
            for (j, (key, value)) in d.entries.iter().enumerate() {
                if key.len() > self.max_value_bytes {
                    let at = format!("descriptor {i}, entry {j}: a key of ");
                    return Err(over(Bound::ValueBytes, key.len(), self.max_value_bytes, at, "bytes"));
                }
                if value.len() > self.max_value_bytes {
                    let at = format!("descriptor {i}, entry `{}`: a value of ", shown(key));
                    return Err(over(Bound::ValueBytes, value.len(), self.max_value_bytes, at, "bytes"));
                }
                total += key.len() + value.len();
            }
        }
        if total > self.max_request_bytes {
            let at = "the namespace and descriptor entries: ".to_string();
            return Err(over(Bound::RequestBytes, total, self.max_request_bytes, at, "bytes"));
        }
        Ok(())
    }
}

/// `key` cut to [`SHOWN`] bytes (at a character boundary), with `…` when cut.
fn shown(key: &str) -> std::borrow::Cow<'_, str> {
    if key.len() <= SHOWN {
        return key.into();
    }
    let end = (0..=SHOWN).rev().find(|&i| key.is_char_boundary(i)).unwrap_or(0);
    format!("{}…", &key[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_policy::Descriptor;

    fn small() -> RequestBounds {
        RequestBounds { max_value_bytes: 8, max_request_bytes: 20, max_entries: 2, max_descriptors: 2 }
    }

    #[test]
    fn each_bound_is_named_with_where_and_how_much() {
        let b = small();
        let d = |entries: &[(&str, &str)]| Descriptor::from_iter(entries.iter().copied());
        let cases: [(&str, Vec<Descriptor>, Bound, &str); 5] = [
            ("ns", vec![d(&[]), d(&[]), d(&[])], Bound::Descriptors, "3 descriptors, over --max-descriptors (2)"),
            (
                "ns",
                vec![d(&[("a", "1"), ("b", "2"), ("c", "3")])],
                Bound::Entries,
                "descriptor 0: 3 entries, over --max-entries (2)",
            ),
            (
                "ns",
                vec![d(&[]), d(&[("a", "1"), ("user", "123456789")])],
                Bound::ValueBytes,
                "descriptor 1, entry `user`: a value of 9 bytes, over --max-value-bytes (8)",
            ),
            (
                "ns",
                vec![d(&[("123456789", "1")])],
                Bound::ValueBytes,
                "descriptor 0, entry 0: a key of 9 bytes, over --max-value-bytes (8)",
            ),
            (
                "namespace",
                vec![d(&[("k", "12345678"), ("j", "12345678")])],
                Bound::RequestBytes,
                "the namespace and descriptor entries: 27 bytes, over --max-request-bytes (20)",
            ),
        ];
        for (ns, descriptors, bound, message) in cases {
            let err = b.check(ns, &descriptors).unwrap_err();
            assert_eq!((err.bound, err.to_string().as_str()), (bound, message));
        }
        assert!(b.check("n", &[d(&[("k", "12345678")]), d(&[("j", "1234567")])]).is_ok(), "20 bytes is at the bound");
    }

    #[test]
    fn a_long_key_is_cut_in_the_message() {
        let b = RequestBounds { max_value_bytes: 100, ..RequestBounds::default() };
        let key = "é".repeat(50);
        let err = b.check("ns", &[Descriptor::from([(key.as_str(), "v".repeat(101).as_str())])]).unwrap_err();
        let message = err.to_string();
        assert!(message.contains(&format!("`{}…`", "é".repeat(32))), "{message}");
    }
}
