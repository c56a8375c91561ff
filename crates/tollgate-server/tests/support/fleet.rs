//! A fleet of Envoy instances that behave as Envoy's `rate_limit_quota` filter does towards its
//! RLQS server, driven on the server's manual clock against the real server over gRPC.
//!
//! Followed from envoyproxy/envoy `source/extensions/filters/http/rate_limit_quota/`:
//! `global_client_impl.cc` at c33e7f82 ("GC" below) and `filter.cc` at 17368991 ("F"), and
//! `source/common/common/token_bucket_impl.cc` ("TB"). Line numbers are those files'.
//!
//! - A request to a bucket not seen before creates it: it is decided by the filter's
//!   `no_assignment_behavior` (ALLOW_ALL when unset, F 47-52, 150-163) and counted (GC 208-213);
//!   the stream is opened then if it is not (GC 169-180), and that bucket alone is reported at
//!   once with 0 s elapsed (GC 215-218); its counts start again from 0.
//! - Every report interval (5 s in Envoy, which ignores `reporting_interval`: shortened here for
//!   tests) one message reports every bucket, idle ones as 0/0, with the domain (GC 122, 144,
//!   130-147, 404-417) and each bucket's `time_elapsed` since its last report in whole seconds
//!   (GC 110-111).
//! - An answer's blanket rules are applied as they are; a token bucket replaces the bucket's only
//!   when `max_tokens`, `tokens_per_fill` or the nanos of `fill_interval` differ (GC 248, 283-290),
//!   and then starts full; it refills continuously at `tokens_per_fill` per whole seconds of
//!   `fill_interval`, every token when under a second (GC 256-270, TB 61-69); a request passes on
//!   a whole token. `requests_per_time_unit` and an empty strategy are skipped, the assignment in
//!   force kept (GC 354-360). Each applied action lasts `assignment_time_to_live`'s whole seconds
//!   (GC 433-446), after which the bucket goes back to `no_assignment_behavior` (GC 448-518, no
//!   `expired_assignment_behavior` set). Actions on empty or unknown bucket ids are ignored
//!   (GC 295-313); an abandon action forgets the bucket (GC 362-366).
//! - A stream the server closes is dropped; the next report opens a new one and reports every
//!   bucket there (GC 381-388, 419-431); assignments and their timers carry on meanwhile.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use futures::channel::mpsc::{UnboundedSender, unbounded};
use tollgate::{Clock, ManualClock};
use tonic::Streaming;
use tonic::transport::Channel;

const SECOND: u64 = 1_000_000_000;

/// What a bucket enforces.
#[derive(Clone, Debug, PartialEq)]
pub enum Enforce {
    Allow,
    Deny,
    Tokens { max: f64, per_second: f64, tokens: f64, at_ns: u64, params: (u32, u32, i32) },
}

/// One bucket of one instance.
#[derive(Debug)]
struct Local {
    allowed: u64,
    denied: u64,
    last_report_ns: u64,
    /// The assignment in force and when it expires.
    assigned: Option<(Enforce, u64)>,
}

/// One stream to the server.
struct Stream {
    reports: UnboundedSender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

/// One Envoy instance: its buckets and its stream.
pub struct Envoy {
    addr: SocketAddr,
    domain: String,
    clock: ManualClock,
    report_every: u64,
    stream: Option<Stream>,
    buckets: BTreeMap<Vec<(String, String)>, Local>,
    next_report_ns: Option<u64>,
    /// Answers received, and reports that found no stream to go on.
    pub answers: usize,
    pub lost_reports: usize,
}

impl Envoy {
    /// An instance of the filter for `domain` pointed at the server's gRPC `addr`, reporting every
    /// `report_every` of `clock`. Like Envoy, it connects at its first request.
    pub fn new(addr: SocketAddr, domain: &str, clock: &ManualClock, report_every: Duration) -> Envoy {
        Envoy {
            addr,
            domain: domain.to_string(),
            clock: clock.clone(),
            report_every: report_every.as_nanos() as u64,
            stream: None,
            buckets: BTreeMap::new(),
            next_report_ns: None,
            answers: 0,
            lost_reports: 0,
        }
    }

    /// One request to the bucket `id` now: true when it passes.
    pub async fn request(&mut self, id: &[(&str, &str)]) -> bool {
        let key = key(id);
        let now = self.clock.now();
        if !self.buckets.contains_key(&key) {
            // GC 208-218: decided by no_assignment_behavior (ALLOW_ALL), counted, reported at once.
            self.buckets.insert(key.clone(), Local { allowed: 1, denied: 0, last_report_ns: now, assigned: None });
            if self.next_report_ns.is_none() {
                self.next_report_ns = Some(now + self.report_every);
            }
            if self.stream.is_none() {
                self.open().await;
            }
            let usage = usage(&key, 1, 0, Duration::ZERO);
            self.buckets.get_mut(&key).unwrap().allowed = 0;
            self.send(vec![usage]).await;
            return true;
        }
        let local = self.buckets.get_mut(&key).unwrap();
        if local.assigned.as_ref().is_some_and(|(_, expires)| *expires <= now) {
            local.assigned = None;
        }
        let pass = match &mut local.assigned {
            None | Some((Enforce::Allow, _)) => true,
            Some((Enforce::Deny, _)) => false,
            Some((Enforce::Tokens { max, per_second, tokens, at_ns, .. }, _)) => {
                *tokens = (*tokens + *per_second * (now - *at_ns) as f64 / SECOND as f64).min(*max);
                *at_ns = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        };
        if pass {
            local.allowed += 1;
        } else {
            local.denied += 1;
        }
        pass
    }

    /// Sends the periodic report if it is due (GC 404-431), opening a stream if there is none.
    pub async fn tick(&mut self) {
        let now = self.clock.now();
        let Some(due) = self.next_report_ns.filter(|due| *due <= now) else { return };
        self.next_report_ns = Some(due + self.report_every);
        if self.stream.is_none() {
            self.open().await;
        }
        let mut usages = Vec::new();
        for (key, local) in &mut self.buckets {
            let elapsed = Duration::from_secs((now - local.last_report_ns) / SECOND);
            usages.push(usage(key, local.allowed, local.denied, elapsed));
            (local.allowed, local.denied, local.last_report_ns) = (0, 0, now);
        }
        self.send(usages).await;
    }

    /// What bucket `id` enforces now, if it has an assignment.
    pub fn enforcing(&self, id: &[(&str, &str)]) -> Option<Enforce> {
        let now = self.clock.now();
        let local = self.buckets.get(&key(id))?;
        local.assigned.as_ref().filter(|(_, expires)| *expires > now).map(|(e, _)| e.clone())
    }

    /// Ends the stream as an instance that shuts down does, after the server has seen it end.
    pub async fn close(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            drop(stream.reports);
            while let Ok(Some(_)) = stream.answers.message().await {}
        }
        self.next_report_ns = None;
    }

    /// Breaks the stream (reset, as a connection lost): the instance keeps its assignments and
    /// opens a new stream at its next report.
    pub fn break_stream(&mut self) {
        if let Some(stream) = self.stream.take() {
            drop(stream.answers);
            drop(stream.reports);
        }
    }

    async fn open(&mut self) {
        let Ok(mut client) = RateLimitQuotaServiceClient::connect(format!("http://{}", self.addr)).await else {
            return;
        };
        let (reports, outgoing) = unbounded();
        if let Ok(answers) = client.stream_rate_limit_quotas(outgoing).await {
            self.stream = Some(Stream { reports, answers: answers.into_inner() });
        }
    }

    /// Sends one report and applies its answer (the server answers each report); a report with
    /// no stream to go on is lost, as Envoy's is.
    async fn send(&mut self, usages: Vec<BucketQuotaUsage>) {
        let Some(stream) = &mut self.stream else {
            self.lost_reports += 1;
            return;
        };
        let report = RateLimitQuotaUsageReports { domain: self.domain.clone(), bucket_quota_usages: usages };
        if stream.reports.unbounded_send(report).is_err() {
            self.stream = None;
            self.lost_reports += 1;
            return;
        }
        match stream.answers.message().await {
            Ok(Some(answer)) => {
                self.answers += 1;
                self.apply(answer);
            }
            _ => self.stream = None,
        }
    }

    /// GC 292-379.
    fn apply(&mut self, answer: RateLimitQuotaResponse) {
        let now = self.clock.now();
        for action in answer.bucket_action {
            let Some(id) = action.bucket_id.filter(|id| !id.bucket.is_empty()) else { continue };
            let mut key: Vec<(String, String)> = id.bucket.into_iter().collect();
            key.sort();
            let Some(local) = self.buckets.get_mut(&key) else { continue };
            match action.bucket_action {
                Some(Action::AbandonAction(_)) => {
                    self.buckets.remove(&key);
                }
                Some(Action::QuotaAssignmentAction(quota)) => {
                    let enforce = match quota.rate_limit_strategy.and_then(|s| s.strategy) {
                        Some(Strategy::BlanketRule(rule)) if rule == BlanketRule::DenyAll as i32 => Enforce::Deny,
                        Some(Strategy::BlanketRule(_)) => Enforce::Allow,
                        Some(Strategy::TokenBucket(bucket)) => {
                            let fill = bucket.fill_interval.unwrap_or_default();
                            let per_fill = bucket.tokens_per_fill.map_or(0, |t| t.value);
                            let params = (bucket.max_tokens, per_fill, fill.nanos);
                            match &local.assigned {
                                Some((kept @ Enforce::Tokens { params: before, .. }, _)) if *before == params => {
                                    kept.clone()
                                }
                                _ => {
                                    let per_second = if fill.seconds <= 0 {
                                        f64::INFINITY
                                    } else {
                                        f64::from(per_fill) / fill.seconds as f64
                                    };
                                    let max = f64::from(bucket.max_tokens);
                                    Enforce::Tokens { max, per_second, tokens: max, at_ns: now, params }
                                }
                            }
                        }
                        // requests_per_time_unit, or nothing: skipped (GC 354-360).
                        _ => continue,
                    };
                    let ttl = quota.assignment_time_to_live.map_or(0, |d| d.seconds.max(0) as u64);
                    local.assigned = Some((enforce, now + ttl * SECOND));
                }
                None => {}
            }
        }
    }
}

fn key(id: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut key: Vec<(String, String)> = id.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    key.sort();
    key
}

fn usage(key: &[(String, String)], allowed: u64, denied: u64, elapsed: Duration) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId { bucket: key.iter().cloned().collect() }),
        time_elapsed: Some(ProtoDuration { seconds: elapsed.as_secs() as i64, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

/// How many requests per second instance `i` sends at `t` (from the run's start).
pub type Demand<'a> = &'a dyn Fn(usize, Duration) -> f64;

/// What a run admitted: per step, per instance.
#[derive(Debug, Default)]
pub struct Timeline {
    pub step: Duration,
    pub admitted: Vec<Vec<u64>>,
    pub asked: Vec<Vec<u64>>,
}

impl Timeline {
    fn steps(&self, span: Duration) -> usize {
        (span.as_nanos() / self.step.as_nanos()) as usize
    }

    /// The most the fleet admitted in any stretch of `window` from `from` on.
    pub fn most_in_any(&self, window: Duration, from: Duration) -> u64 {
        let (w, start) = (self.steps(window), self.steps(from));
        let total: Vec<u64> = self.admitted.iter().map(|s| s.iter().sum()).collect();
        (start..total.len().saturating_sub(w) + 1)
            .map(|i| total[i..(i + w).min(total.len())].iter().sum::<u64>())
            .max()
            .unwrap_or(0)
    }

    /// What instance `i` (or all, `None`) admitted in [from, to).
    pub fn admitted(&self, i: Option<usize>, from: Duration, to: Duration) -> u64 {
        let range = self.steps(from)..self.steps(to).min(self.admitted.len());
        self.admitted[range].iter().map(|s| i.map_or_else(|| s.iter().sum(), |i| s[i])).sum()
    }

    /// What instance `i` asked in [from, to).
    pub fn asked(&self, i: usize, from: Duration, to: Duration) -> u64 {
        let range = self.steps(from)..self.steps(to).min(self.asked.len());
        self.asked[range].iter().map(|s| s[i]).sum()
    }
}

/// RLS callers beside a fleet: each of their requests is one `ShouldRateLimit` call to the
/// server's RLS (`hits_addend` 1) on the fleet's bucket id as its one descriptor.
pub struct RlsCallers<'a> {
    pub client: RateLimitServiceClient<Channel>,
    pub domain: String,
    /// How many requests per second they send at `t` (from the run's start).
    pub demand: &'a dyn Fn(Duration) -> f64,
    carry: f64,
}

impl<'a> RlsCallers<'a> {
    pub fn new(client: RateLimitServiceClient<Channel>, domain: &str, demand: &'a dyn Fn(Duration) -> f64) -> Self {
        RlsCallers { client, domain: domain.to_string(), demand, carry: 0.0 }
    }

    /// Sends this step's requests: how many were asked, and how many allowed.
    async fn step(&mut self, id: &[(&str, &str)], t: Duration, step: Duration) -> (u64, u64) {
        self.carry += (self.demand)(t) * step.as_secs_f64();
        let (mut asked, mut admitted) = (0, 0);
        while self.carry >= 1.0 {
            self.carry -= 1.0;
            asked += 1;
            let answer = super::should_rate_limit(&mut self.client, &self.domain, vec![super::descriptor(id)], 1).await;
            if answer.overall_code == Code::Ok as i32 {
                admitted += 1;
            }
        }
        (asked, admitted)
    }
}

/// Runs `fleet` for `length` in steps of `step` of `clock`, each instance sending `demand`'s
/// requests (spread evenly) to bucket `id`; an instance with no demand yet sends nothing (its
/// bucket is created by its first request). Reports are sent when due, in instance order.
pub async fn run(
    fleet: &mut [Envoy],
    clock: &ManualClock,
    id: &[(&str, &str)],
    step: Duration,
    length: Duration,
    demand: Demand<'_>,
    timeline: &mut Timeline,
) {
    run_with(fleet, None, clock, &[id], step, length, &|i, _, t| demand(i, t), timeline).await;
}

/// How many requests per second instance `i` sends to its bucket `b` at `t` (from the run's start).
pub type BucketDemand<'a> = &'a dyn Fn(usize, usize, Duration) -> f64;

/// [`run`] with several buckets per instance (`ids`, each instance's demand on bucket `b` going
/// to `ids[b]`; the timeline counts an instance's buckets together), and RLS callers sending
/// their requests to `ids[0]` after the fleet's in each step: their admissions are the
/// timeline's last column (after the instances').
#[allow(clippy::too_many_arguments)]
pub async fn run_with(
    fleet: &mut [Envoy],
    mut callers: Option<&mut RlsCallers<'_>>,
    clock: &ManualClock,
    ids: &[&[(&str, &str)]],
    step: Duration,
    length: Duration,
    demand: BucketDemand<'_>,
    timeline: &mut Timeline,
) {
    timeline.step = step;
    let start = timeline.admitted.len() as u32;
    let mut carry = vec![vec![0.0f64; ids.len()]; fleet.len()];
    let columns = fleet.len() + usize::from(callers.is_some());
    for s in 0..(length.as_nanos() / step.as_nanos()) as u32 {
        let t = step * (start + s);
        let mut admitted = vec![0; columns];
        let mut asked = vec![0; columns];
        for (i, envoy) in fleet.iter_mut().enumerate() {
            envoy.tick().await;
            for (b, id) in ids.iter().enumerate() {
                carry[i][b] += demand(i, b, t) * step.as_secs_f64();
                while carry[i][b] >= 1.0 {
                    carry[i][b] -= 1.0;
                    asked[i] += 1;
                    if envoy.request(id).await {
                        admitted[i] += 1;
                    }
                }
            }
        }
        if let Some(callers) = callers.as_deref_mut() {
            (asked[fleet.len()], admitted[fleet.len()]) = callers.step(ids[0], t, step).await;
        }
        timeline.admitted.push(admitted);
        timeline.asked.push(asked);
        clock.advance(step);
    }
}
