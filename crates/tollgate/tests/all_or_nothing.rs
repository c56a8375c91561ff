//! All-or-nothing against a model: random parts (enforcing or only counting, with or without
//! room, answering at once or later), decided by [`AllOrNothing`] directly and through
//! [`Chain`], checked against plain arithmetic over each part's free permits.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{
    AllOrNothing, Answer, Chain, Check, Decision, FixedWindow, Lease, Limiter, ManualClock, PartAnswer, Quota,
    RateLimiter, Refund, Reply, Step,
};

/// One part: a fixed window of `limit` of which `used` are spent, asked for `n`.
#[derive(Clone, Debug)]
struct Part {
    limit: u64,
    used: u64,
    n: u64,
    enforces: bool,
}

fn part() -> impl Strategy<Value = Part> {
    (1u64..6, 0u64..6, 0u64..7, any::<bool>()).prop_map(|(limit, used, n, enforces)| Part {
        limit,
        used: used.min(limit),
        n,
        enforces,
    })
}

fn limiter(part: &Part, clock: &ManualClock) -> Limiter<FixedWindow, ManualClock> {
    let quota = Quota::per(Duration::from_secs(60), part.limit).unwrap();
    let limiter = Limiter::builder(FixedWindow::new(quota)).clock(clock.clone()).build();
    if part.used > 0 {
        let _ = limiter.try_acquire(part.used).unwrap();
    }
    limiter
}

/// What the model says: which part denies, and each part's `remaining` after the call.
fn model(parts: &[Part], check_only: bool) -> (Option<usize>, Vec<u64>) {
    let free: Vec<u64> = parts.iter().map(|p| p.limit - p.used).collect();
    let denied_by = parts.iter().zip(&free).position(|(p, &free)| p.enforces && p.n > free);
    let remaining = parts
        .iter()
        .zip(&free)
        .map(|(p, &free)| {
            let takes = !check_only && denied_by.is_none() && p.n <= free;
            if takes { free - p.n } else { free }
        })
        .collect();
    (denied_by, remaining)
}

fn run(limiter: &Limiter<FixedWindow, ManualClock>, step: Step, n: u64) -> Reply {
    match step {
        Step::Take(_) => Reply::Took(limiter.try_acquire(n)),
        Step::Check(_) => Reply::Checked(limiter.check(n)),
        Step::Probe(_) => Reply::Checked(limiter.check(0)),
        Step::GiveBack(_, lease) => {
            limiter.give_back(lease);
            Reply::GaveBack
        }
    }
}

proptest! {
    #[test]
    fn a_call_matches_the_model(
        parts in prop::collection::vec(part(), 1..6), check_only in any::<bool>(), denier_only in any::<bool>(),
    ) {
        let clock = ManualClock::new();
        let limiters: Vec<_> = parts.iter().map(|p| limiter(p, &clock)).collect();
        let enforces = parts.iter().map(|p| p.enforces);
        let call = if check_only { AllOrNothing::check(enforces) } else { AllOrNothing::new(enforces) };
        let mut call = if denier_only { call.denier_only() } else { call };
        let mut steps = Vec::new();
        while let Some(step) = call.step() {
            let i = step.part();
            steps.push(format!("{step:?}"));
            // After a denial, no part is taken from: only checked, probed or given back.
            if call.is_denied() {
                prop_assert!(!matches!(step, Step::Take(_)), "took from part {} after a denial", i);
            }
            call.reply(run(&limiters[i], step, parts[i].n));
        }
        let outcome = call.finish();
        let (denied_by, remaining) = model(&parts, check_only);
        prop_assert_eq!(outcome.denied_by(), denied_by, "steps {:?}", steps);
        for (i, answer) in outcome.parts().iter().enumerate() {
            prop_assert_eq!(limiters[i].check(0).unwrap().remaining, remaining[i], "part {} in its limiter", i);
            // After a denial, a caller that reads only the denier's state has the others unread:
            // the parts after it not asked, those before it that took given back unprobed.
            let free = parts[i].limit - parts[i].used;
            let took = !check_only && parts[i].n <= free;
            let unread = denier_only && denied_by.is_some_and(|d| i > d || (i < d && took));
            prop_assert_eq!(matches!(answer, PartAnswer::Unread), unread, "part {} ({:?})", i, answer);
            if unread {
                continue;
            }
            // The one metadata rule: every part reports its state as the call left it.
            prop_assert_eq!(answer.meta().remaining, remaining[i], "part {} ({:?})", i, answer);
            let first_denial_or_earlier = denied_by.is_none_or(|d| i <= d);
            prop_assert_eq!(answer.is_limited(), parts[i].n > free, "part {}", i);
            match answer {
                PartAnswer::Taken(_) => prop_assert!(!check_only && denied_by.is_none()),
                PartAnswer::GivenBack(_) => prop_assert!(denied_by.is_some_and(|d| i < d)),
                PartAnswer::NoRoom(_) => prop_assert!(!check_only && first_denial_or_earlier),
                PartAnswer::Checked(_) => prop_assert!(check_only || denied_by.is_some_and(|d| i > d)),
                PartAnswer::Unread => unreachable!("told apart above"),
            }
        }
        if denied_by.is_some() {
            // A denied call leaves every counter as it was.
            for (i, p) in parts.iter().enumerate() {
                prop_assert_eq!(limiters[i].check(0).unwrap().remaining, p.limit - p.used);
            }
        }
    }

    #[test]
    fn a_chain_decides_as_the_model_whether_its_parts_answer_now_or_later(
        a in part(), b in part(), later in any::<(bool, bool)>(),
    ) {
        let clock = ManualClock::new();
        let (mut a, mut b) = (a, b);
        // A chain asks both parts for the same permits, and both enforce.
        b.n = a.n;
        a.enforces = true;
        b.enforces = true;
        let chain = Chain::new(Later::new(limiter(&a, &clock), later.0), Later::new(limiter(&b, &clock), later.1));
        let decided = block_on(chain.decide(&(), a.n));
        let (denied_by, remaining) = model(&[a.clone(), b.clone()], false);
        prop_assert_eq!(decided.is_err(), denied_by.is_some());
        let seen = match &decided { Ok(lease) => lease.remaining(), Err(no) => no.remaining() };
        prop_assert_eq!(seen, remaining[0].min(remaining[1]), "tightest remaining");
        prop_assert_eq!(chain.first().0.check(0).unwrap().remaining, remaining[0]);
        prop_assert_eq!(chain.second().0.check(0).unwrap().remaining, remaining[1]);
    }
}

/// A limiter that answers a moment later when `later`, as a distributed one does.
struct Later(Limiter<FixedWindow, ManualClock>, bool);

impl Later {
    fn new(limiter: Limiter<FixedWindow, ManualClock>, later: bool) -> Later {
        Later(limiter, later)
    }

    fn answer<T: Send + 'static>(&self, value: T) -> Answer<T> {
        if self.1 {
            Answer::Pending(Box::pin(async move {
                tokio::task::yield_now().await;
                value
            }))
        } else {
            Answer::Ready(value)
        }
    }
}

impl RateLimiter for Later {
    fn decide(&self, _key: &(), n: u64) -> Decision {
        self.answer(self.0.try_acquire(n))
    }
    fn check(&self, _key: &(), n: u64) -> Check {
        self.answer(self.0.check(n))
    }
    fn give_back(&self, _key: &(), lease: Lease) -> Refund {
        self.0.give_back(lease);
        self.answer(())
    }
    fn capacity(&self) -> u64 {
        self.0.capacity()
    }
    fn window(&self) -> Option<Duration> {
        self.0.window()
    }
}

fn block_on<T: Send + 'static>(answer: Answer<T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async { answer.await })
}
