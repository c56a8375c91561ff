//! Just enough HPACK (RFC 7541) for a gRPC client that reads only two headers back.
//!
//! The request's header block never changes, so it is written once, every field a literal that
//! is not indexed (no dynamic table to keep in step with the server). A response's blocks are
//! walked for `:status` and `grpc-status` only; the client announces a header table of 0 bytes, so
//! the server cannot refer to earlier headers and both come as a static index or a literal. Their
//! values are digits, and the server Huffman-codes them (h2 always does): the few codes of
//! RFC 7541 Appendix B needed to read digits, and to recognise the name `grpc-status`, are below;
//! anything else is skipped unread.

/// `(symbol, code, bits)` from RFC 7541 Appendix B, for the symbols of `grpc-status` and the digits.
const CODES: [(u8, u32, u32); 19] = [
    (b'0', 0x0, 5),
    (b'1', 0x1, 5),
    (b'2', 0x2, 5),
    (b'3', 0x19, 6),
    (b'4', 0x1a, 6),
    (b'5', 0x1b, 6),
    (b'6', 0x1c, 6),
    (b'7', 0x1d, 6),
    (b'8', 0x1e, 6),
    (b'9', 0x1f, 6),
    (b'-', 0x16, 6),
    (b'a', 0x3, 5),
    (b'c', 0x4, 5),
    (b'g', 0x26, 6),
    (b'p', 0x2b, 6),
    (b'r', 0x2c, 6),
    (b's', 0x8, 5),
    (b't', 0x9, 5),
    (b'u', 0x2d, 6),
];

/// The static table's `:status` entries: index 8 is 200, 9 to 14 the other statuses it has.
const STATUSES: [(u64, u16); 7] = [(8, 200), (9, 204), (10, 206), (11, 304), (12, 400), (13, 404), (14, 500)];
/// The static table's index of the name `:status`.
const STATUS_NAME: u64 = 8;

/// The header block of every request: `POST`, `http`, `path`, `authority`, `application/grpc`,
/// `te: trailers`.
pub(super) fn request_block(path: &str, authority: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static 3 and 6)
    put_int(&mut block, 0x00, 4, 4); // :path, a literal not indexed, name = static 4
    put_str(&mut block, path.as_bytes());
    put_int(&mut block, 0x00, 4, 1); // :authority (static 1)
    put_str(&mut block, authority.as_bytes());
    put_int(&mut block, 0x00, 4, 31); // content-type (static 31)
    put_str(&mut block, b"application/grpc");
    block.push(0x00); // te, a new name
    put_str(&mut block, b"te");
    put_str(&mut block, b"trailers");
    block
}

/// `value` with an `n`-bit prefix after the bits `first` (RFC 7541, 5.1).
fn put_int(out: &mut Vec<u8>, first: u8, n: u32, value: u64) {
    let max = (1u64 << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// A string literal, not Huffman-coded.
fn put_str(out: &mut Vec<u8>, bytes: &[u8]) {
    put_int(out, 0x00, 7, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// What a response's header blocks said, of what this client reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// `:status`, if it was there and readable (`Some(0)`: there but not digits this reads).
    pub(super) status: Option<u16>,
    /// `grpc-status`, likewise.
    pub(super) grpc_status: Option<u32>,
}

/// The name `grpc-status` as h2 sends it, Huffman-coded.
pub(super) struct Names {
    grpc_status: Vec<u8>,
}

impl Names {
    pub(super) fn new() -> Names {
        Names { grpc_status: huffman(b"grpc-status").unwrap_or_default() }
    }

    /// Reads `block` (a whole header block) into `seen`; `Err` if it is not valid HPACK.
    pub(super) fn scan(&self, mut block: &[u8], seen: &mut Seen) -> Result<(), &'static str> {
        while let Some(&first) = block.first() {
            if first & 0x80 != 0 {
                let index = int(&mut block, 7)?;
                if let Some(&(_, status)) = STATUSES.iter().find(|(i, _)| *i == index) {
                    seen.status = Some(status);
                }
                continue;
            }
            let name_index = if first & 0x40 != 0 {
                int(&mut block, 6)?
            } else if first & 0x20 != 0 {
                int(&mut block, 5)?; // a dynamic table size update
                continue;
            } else {
                int(&mut block, 4)?
            };
            let is_grpc_status = if name_index == 0 {
                let (huffman, name) = string(&mut block)?;
                if huffman { name == self.grpc_status.as_slice() } else { name == b"grpc-status" }
            } else {
                false
            };
            let (huffman, value) = string(&mut block)?;
            if name_index == STATUS_NAME {
                seen.status = Some(digits(huffman, value).and_then(|v| u16::try_from(v).ok()).unwrap_or(0));
            } else if is_grpc_status {
                seen.grpc_status = Some(digits(huffman, value).and_then(|v| u32::try_from(v).ok()).unwrap_or(u32::MAX));
            }
            // Any other name, including one from the dynamic table (which this client keeps at 0
            // bytes, so there is none to look up), is not one this reads.
        }
        Ok(())
    }
}

/// An integer with an `n`-bit prefix; consumes it.
fn int(block: &mut &[u8], n: u32) -> Result<u64, &'static str> {
    const BAD: &str = "a truncated or oversized integer";
    let (&first, rest) = block.split_first().ok_or(BAD)?;
    *block = rest;
    let max = (1u64 << n) - 1;
    let mut value = u64::from(first) & max;
    if value < max {
        return Ok(value);
    }
    for shift in (0..56).step_by(7) {
        let (&byte, rest) = block.split_first().ok_or(BAD)?;
        *block = rest;
        value += u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    Err(BAD)
}

/// A string literal: whether it is Huffman-coded, and its bytes; consumes it.
fn string<'a>(block: &mut &'a [u8]) -> Result<(bool, &'a [u8]), &'static str> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = usize::try_from(int(block, 7)?).map_err(|_| "a string longer than memory")?;
    if block.len() < len {
        return Err("a truncated string");
    }
    let (bytes, rest) = block.split_at(len);
    *block = rest;
    Ok((huffman, bytes))
}

/// The number a string of digits says, Huffman-coded or not; `None` if it is not only digits.
fn digits(huffman: bool, bytes: &[u8]) -> Option<u64> {
    let mut value: u64 = 0;
    let mut push = |digit: u8| -> Option<()> {
        value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
        Some(())
    };
    if !huffman {
        if bytes.is_empty() {
            return None;
        }
        for &b in bytes {
            push(b.checked_sub(b'0').filter(|d| *d < 10)?)?;
        }
        return Some(value);
    }
    let (mut code, mut bits) = (0u32, 0u32);
    let mut any = false;
    for &byte in bytes {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            bits += 1;
            let digit = CODES[..10].iter().find(|(_, c, n)| *n == bits && *c == code);
            if let Some(&(symbol, _, _)) = digit {
                push(symbol - b'0')?;
                (code, bits, any) = (0, 0, true);
            } else if bits > 7 {
                return None; // no digit's code is this long, and padding is at most 7 bits
            }
        }
    }
    // What is left must be padding: the first bits of EOS, all ones.
    (any && code == (1 << bits) - 1).then_some(value)
}

/// `text` Huffman-coded, if every symbol of it is in [`CODES`].
fn huffman(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u64, 0u32);
    for symbol in text {
        let &(_, code, n) = CODES.iter().find(|(s, _, _)| s == symbol)?;
        acc = (acc << n) | u64::from(code);
        bits += n;
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) | ((1 << (8 - bits)) - 1)) as u8);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huffman_digits_match_the_rfc_examples() {
        // RFC 7541 C.6.1 and C.6.2: ":status 302" and "307", Huffman-coded.
        assert_eq!(huffman(b"302").unwrap(), [0x64, 0x02]);
        assert_eq!(huffman(b"307").unwrap(), [0x64, 0x0e, 0xff]);
        assert_eq!(digits(true, &[0x64, 0x02]), Some(302));
        assert_eq!(digits(true, &[0x64, 0x0e, 0xff]), Some(307));
        for n in [0, 1, 2, 9, 14, 16, 404, 1234567890] {
            let text = n.to_string();
            assert_eq!(digits(true, &huffman(text.as_bytes()).unwrap()), Some(n), "{n}");
            assert_eq!(digits(false, text.as_bytes()), Some(n), "{n}");
        }
        // "private" (RFC 7541 C.6.1) is not digits; nor is padding alone, or padding of 8 bits.
        assert_eq!(digits(true, &[0xae, 0xc3, 0x77, 0x1a, 0x4b]), None);
        assert_eq!(digits(true, &[0xff]), None);
        assert_eq!(digits(true, &[0x07, 0xff]), None);
        assert_eq!(digits(false, b""), None);
        assert_eq!(digits(false, b"1a"), None);
    }

    #[test]
    fn statuses_are_found_in_any_representation() {
        let names = Names::new();
        let scan = |block: &[u8]| {
            let mut seen = Seen::default();
            names.scan(block, &mut seen).map(|()| seen)
        };
        // :status 200 indexed; a size update; content-type as a literal with indexing.
        let mut block = vec![0x88, 0x20, 0x5f, 0x03];
        block.extend_from_slice(b"a/b");
        assert_eq!(scan(&block), Ok(Seen { status: Some(200), grpc_status: None }));
        assert_eq!(scan(&[0x8d]), Ok(Seen { status: Some(404), grpc_status: None }));
        // grpc-status 14 as h2 writes it: a new name with incremental indexing, both Huffman-coded.
        let mut block = vec![0x40, 0x80 | names.grpc_status.len() as u8];
        block.extend_from_slice(&names.grpc_status);
        let value = huffman(b"14").unwrap();
        block.push(0x80 | value.len() as u8);
        block.extend_from_slice(&value);
        // ... then grpc-message, never indexed, and :status 503 as a literal with its name indexed.
        block.extend_from_slice(&[0x10, 0x0c]);
        block.extend_from_slice(b"grpc-message");
        block.extend_from_slice(&[0x02, b'h', b'i', 0x08, 0x03]);
        block.extend_from_slice(b"503");
        assert_eq!(scan(&block), Ok(Seen { status: Some(503), grpc_status: Some(14) }));
        // Not Huffman-coded, and a long name index (a multi-byte integer).
        let mut block = vec![0x00, 0x0b];
        block.extend_from_slice(b"grpc-status");
        block.extend_from_slice(&[0x01, b'0', 0x7f, 0x80, 0x01, 0x00]);
        assert_eq!(scan(&block), Ok(Seen { status: None, grpc_status: Some(0) }));
        assert!(scan(&[0x40, 0x05, b'a']).is_err());
        assert!(scan(&[0xff]).is_err());
    }

    #[test]
    fn the_request_block_reads_back() {
        let block = request_block("/p", "h:1");
        let mut expected = vec![0x83, 0x86, 0x04, 0x02, b'/', b'p', 0x01, 0x03, b'h', b':', b'1', 0x0f, 0x10, 16];
        expected.extend_from_slice(b"application/grpc");
        expected.extend_from_slice(&[0x00, 0x02, b't', b'e', 0x08]);
        expected.extend_from_slice(b"trailers");
        assert_eq!(block, expected);
        let mut seen = Seen::default();
        Names::new().scan(&block, &mut seen).unwrap();
        assert_eq!(seen, Seen::default());
    }
}
