//! Envoy's `RateLimitRequest` written straight into the output buffer, and a response's
//! `overall_code` read without decoding the rest.
//!
//! The request is the one `grpc::Client` builds with prost (same fields, in field-number order as
//! prost writes them, so the same bytes: a test checks it), spliced from parts encoded once, so
//! a request costs a few copies and no allocation whatever the number of keys.

use crate::Shape;

/// `RateLimitRequest.domain` (field 1) and `RateLimitDescriptor.entries` / `Entry.key` (field 1):
/// length-delimited.
const FIELD_1_BYTES: u8 = 0x0a;
/// `RateLimitRequest.descriptors` (field 2) and `Entry.value` (field 2): length-delimited.
const FIELD_2_BYTES: u8 = 0x12;
/// `RateLimitRequest.hits_addend` (field 3): varint.
const FIELD_3_VARINT: u8 = 0x18;

/// The parts of every request of a run.
pub(super) struct Template {
    /// Field 1, the domain, encoded whole.
    domain: Vec<u8>,
    /// The keys of descriptors 1.., `k1`, `k2`, ...
    extra_keys: Vec<String>,
    keys: u64,
}

impl Template {
    pub(super) fn new(shape: &Shape) -> Template {
        let mut domain = vec![FIELD_1_BYTES];
        put_varint(&mut domain, shape.namespace.len() as u64);
        domain.extend_from_slice(shape.namespace.as_bytes());
        Template { domain, extra_keys: (1..shape.descriptors).map(|d| format!("k{d}")).collect(), keys: shape.keys }
    }

    /// The encoded length of request `i` (its gRPC message, without the 5-byte prefix).
    pub(super) fn len(&self, i: u64) -> usize {
        self.len_of(Shape::method(i).len(), Decimal::new(i % self.keys).digits().len())
    }

    /// The length of the longest request.
    pub(super) fn max_len(&self) -> usize {
        self.len_of("POST".len(), Decimal::new(self.keys.saturating_sub(1)).digits().len())
    }

    /// The length of a request whose method has `method` bytes and whose key has `digits` digits.
    fn len_of(&self, method: usize, digits: usize) -> usize {
        let (method_entry, user_entry) = first_entries(method, digits);
        let mut len = self.domain.len() + delimited_len(delimited_len(method_entry) + delimited_len(user_entry)) + 2;
        for k in &self.extra_keys {
            len += delimited_len(delimited_len(extra_entry(k.len(), digits)));
        }
        len
    }

    /// Appends request `i` (`len(i)` bytes) to `out`.
    pub(super) fn write(&self, i: u64, out: &mut Vec<u8>) {
        let key = Decimal::new(i % self.keys);
        let digits = key.digits();
        let method = Shape::method(i).as_bytes();
        out.extend_from_slice(&self.domain);

        let user_len = 5 + digits.len();
        let (method_entry, user_entry) = first_entries(method.len(), digits.len());
        out.push(FIELD_2_BYTES);
        put_varint(out, (delimited_len(method_entry) + delimited_len(user_entry)) as u64);
        out.push(FIELD_1_BYTES);
        put_varint(out, method_entry as u64);
        put_bytes(out, FIELD_1_BYTES, b"req.method");
        put_bytes(out, FIELD_2_BYTES, method);
        out.push(FIELD_1_BYTES);
        put_varint(out, user_entry as u64);
        put_bytes(out, FIELD_1_BYTES, b"user_id");
        out.push(FIELD_2_BYTES);
        put_varint(out, user_len as u64);
        out.extend_from_slice(b"user-");
        out.extend_from_slice(digits);

        let value_len = 1 + digits.len();
        for k in &self.extra_keys {
            let entry = extra_entry(k.len(), digits.len());
            out.push(FIELD_2_BYTES);
            put_varint(out, delimited_len(entry) as u64);
            out.push(FIELD_1_BYTES);
            put_varint(out, entry as u64);
            put_bytes(out, FIELD_1_BYTES, k.as_bytes());
            out.push(FIELD_2_BYTES);
            put_varint(out, value_len as u64);
            out.push(b'v');
            out.extend_from_slice(digits);
        }
        out.extend_from_slice(&[FIELD_3_VARINT, 1]);
    }
}

/// The lengths of the first descriptor's entries: `req.method` = a method of `method` bytes, and
/// `user_id` = `user-` and `digits` digits.
fn first_entries(method: usize, digits: usize) -> (usize, usize) {
    (
        delimited_len(b"req.method".len()) + delimited_len(method),
        delimited_len(b"user_id".len()) + delimited_len(5 + digits),
    )
}

/// The length of an entry of a later descriptor: a key of `key` bytes, `v` and `digits` digits.
fn extra_entry(key: usize, digits: usize) -> usize {
    delimited_len(key) + delimited_len(1 + digits)
}

/// A length-delimited field of `len` bytes: tag, length, bytes.
fn delimited_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_bytes(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A number's decimal digits, without allocating.
pub(super) struct Decimal {
    buf: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(super) fn new(mut n: u64) -> Decimal {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { buf, start }
    }

    pub(super) fn digits(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `RateLimitResponse.overall_code` of an encoded response: 0 (`UNKNOWN`) when absent, as
/// protobuf reads it; `None` if the message is malformed.
pub(super) fn overall_code(mut message: &[u8]) -> Option<u64> {
    let mut code = 0;
    while !message.is_empty() {
        let tag = varint(&mut message)?;
        match (tag >> 3, tag & 7) {
            (1, 0) => code = varint(&mut message)?,
            (_, 0) => {
                varint(&mut message)?;
            }
            (_, 1) => message = message.get(8..)?,
            (_, 2) => {
                let len = usize::try_from(varint(&mut message)?).ok()?;
                message = message.get(len..)?;
            }
            (_, 5) => message = message.get(4..)?,
            _ => return None,
        }
    }
    Some(code)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use prost::Message;

    use super::*;

    /// The request `grpc::Client` sends, as prost encodes it.
    fn prost_request(shape: &Shape, i: u64) -> Vec<u8> {
        crate::grpc::request(shape, i).encode_to_vec()
    }

    #[test]
    fn requests_are_the_bytes_prost_writes() {
        let long = "n".repeat(300);
        for (namespace, descriptors, keys) in [("example.org", 2, 1000), ("a", 1, 1), (long.as_str(), 64, u64::MAX)] {
            let shape = Shape { namespace: namespace.to_string(), descriptors, keys };
            let template = Template::new(&shape);
            for i in [0, 1, 2, 3, 9, 10, 99, 100, 999, 1000, 12_345, u64::MAX / 3, u64::MAX] {
                let mut out = b"prefix".to_vec();
                template.write(i, &mut out);
                let expected = prost_request(&shape, i);
                assert_eq!(&out[6..], expected.as_slice(), "{namespace:.10} {descriptors} {keys} {i}");
                assert_eq!(template.len(i), expected.len());
                assert!(template.max_len() >= expected.len());
            }
        }
    }

    #[test]
    fn overall_code_is_read_wherever_it_is() {
        let response = RateLimitResponse { overall_code: 2, ..Default::default() }.encode_to_vec();
        assert_eq!(overall_code(&response), Some(2));
        assert_eq!(overall_code(&[]), Some(0));
        // statuses (field 2, a message) before the code, then a fixed64 and a fixed32 field.
        let bytes = [0x12, 0x02, 0x08, 0x01, 0x08, 0x01, 0x19, 0, 0, 0, 0, 0, 0, 0, 0, 0x25, 0, 0, 0, 0];
        assert_eq!(overall_code(&bytes), Some(1));
        assert_eq!(overall_code(&[0x08]), None);
        assert_eq!(overall_code(&[0x12, 0x05, 0x00]), None);
        assert_eq!(overall_code(&[0x0b]), None);
    }
}
