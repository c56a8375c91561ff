//! Resident memory of a `Keyed<u64, TokenBucket>` under a flood of 10 million distinct keys on
//! 2 threads, against the memory of the same table filled exactly to its cap — measured from the
//! process (`VmRSS` in `/proc/self/status`, Linux), for one cap policy per run:
//!
//! ```text
//! cargo run --release -p tollgate --example flood_memory -- reject|evict|admit [CAP [FLOOD]]
//! ```
//!
//! Prints the RSS at the cap and after the flood, and fails (exit 1) when the flood grew it by
//! more than 10 %, or when the fill did not reach the cap (the figure would then be meaningless).
//! `FLOOD` (default 10 million) turns the table over more often: with `evict`, each flood key
//! replaces a stored one.
//!
//! Every key stays live (not idle) for the whole run: a key that took its one permit of an hour
//! is idle an hour later. With a shorter quota the table sweeps its own idle keys while it is
//! being filled (a key of 10 per minute is idle 6 s after its permit, and filling 10 million keys
//! takes longer than that), so it never holds the cap before the flood, and the flood's "growth"
//! is the rest of the fill (measured so: +57 to +81 % at a 10 million cap, with 3.6 million keys
//! stored when the fill gave up). The fill asks for the table's length once per 4,096 keys, not
//! per key: `len` reads every shard's lock, and that alone made the fill outlast the 6 s.

use std::num::NonZeroUsize;

use tollgate::{AtKeyLimit, Keyed, Quota, TokenBucket};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let policy = match args.first().map(String::as_str) {
        Some("reject") => AtKeyLimit::Reject,
        Some("evict") => AtKeyLimit::EvictNearestIdle,
        Some("admit") => AtKeyLimit::AdmitUnstored,
        _ => {
            eprintln!("usage: flood_memory reject|evict|admit [CAP [FLOOD]]");
            std::process::exit(2);
        }
    };
    let cap: usize = args.get(1).map_or(Ok(1_000_000), |c| c.parse()).expect("CAP is a number of keys");
    let flood: u64 = args.get(2).map_or(Ok(10_000_000), |f| f.parse()).expect("FLOOD is a number of keys");
    let quota = Quota::per_hour(1).expect("valid quota");
    let keyed: Keyed<u64, TokenBucket> = Keyed::builder(TokenBucket::new(quota))
        .max_keys(NonZeroUsize::new(cap).expect("CAP > 0"))
        .at_key_limit(policy)
        .build();
    let before = rss_bytes();
    // Shards fill unevenly: go on past `cap` keys until every shard is full (the few keys sent to
    // a full shard meanwhile meet the policy, as the flood's will).
    let mut key = 0u64;
    while keyed.len() < keyed.max_keys() && key < 4 * cap as u64 {
        for _ in 0..4096 {
            let _ = keyed.try_acquire(&key, 1);
            key += 1;
        }
    }
    if keyed.len() != keyed.max_keys() {
        eprintln!("the fill stored {} keys of {} after {key}: nothing to measure", keyed.len(), keyed.max_keys());
        std::process::exit(1);
    }
    let at_cap = rss_bytes();
    let first = key;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let keyed = &keyed;
            s.spawn(move || {
                for i in 0..flood / 2 {
                    let _ = keyed.try_acquire(&(first + 2 * i + t), 1);
                }
            });
        }
    });
    let after = rss_bytes();
    let table = at_cap.saturating_sub(before);
    let grown = after.saturating_sub(at_cap);
    println!(
        "{}: cap {cap} keys ({} stored after the flood): RSS {} MiB at the cap (table {} MiB), {} MiB after {flood} new \
         keys on 2 threads: +{:.1}% of the table",
        policy.name(),
        keyed.len(),
        at_cap >> 20,
        table >> 20,
        after >> 20,
        100.0 * grown as f64 / table.max(1) as f64
    );
    if keyed.len() > keyed.max_keys() || grown * 10 > table {
        std::process::exit(1);
    }
}
