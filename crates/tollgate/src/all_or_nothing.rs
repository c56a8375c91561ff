//! [`AllOrNothing`]: the one place that decides a call over several limits together, whatever
//! holds their state (in this process, across the network, behind a lock or not). Its rules are
//! on the type, where the public documentation shows them.

use smallvec::SmallVec;

use crate::answer::Answer;
use crate::decision::{Lease, Rejected};
use crate::rate_limiter::RateLimiter;
use crate::snapshot::Meta;

/// Parts kept inline before a call's answers spill to the heap: a [`Chain`](crate::Chain) and a
/// tower layer's two policies allocate nothing.
const INLINE: usize = 2;

/// What a part answers with carries the part's state: a [`Lease`], a [`Rejected`], or a caller's
/// own denial (a tower layer's, which names the policy that said no).
pub trait PartState {
    /// The part's state as this answer left it.
    fn meta(&self) -> Meta;
}

impl PartState for Lease {
    fn meta(&self) -> Meta {
        Lease::meta(self)
    }
}

impl PartState for Rejected {
    fn meta(&self) -> Meta {
        Rejected::meta(self)
    }
}

/// What to run on one part next (parts are numbered in the order they were given). `T` is what a
/// take holds ([`Lease`] unless the caller's parts hold something else).
#[derive(Debug)]
#[must_use = "a Step is work the caller must run, then reply to"]
pub enum Step<T = Lease> {
    /// Take the part's permits; reply [`Reply::Took`].
    Take(usize),
    /// Check the part's permits, taking nothing; reply [`Reply::Checked`].
    Check(usize),
    /// Give what this part took back to it; reply [`Reply::GaveBack`].
    GiveBack(usize, T),
    /// Probe the part (`n = 0`) after its refund; reply [`Reply::Checked`].
    Probe(usize),
}

impl<T> Step<T> {
    /// The part this step runs on.
    pub fn part(&self) -> usize {
        match *self {
            Step::Take(i) | Step::Check(i) | Step::GiveBack(i, _) | Step::Probe(i) => i,
        }
    }
}

impl Step {
    /// Runs this step on `limiter`, the part it names, asked for `n` permits of `key`.
    pub fn run<K: ?Sized, L: RateLimiter<K> + ?Sized>(self, limiter: &L, key: &K, n: u64) -> Answer<Reply> {
        match self {
            Step::Take(_) => limiter.decide(key, n).map(Reply::Took),
            Step::Check(_) => limiter.check(key, n).map(Reply::Checked),
            Step::Probe(_) => limiter.check(key, 0).map(Reply::Checked),
            Step::GiveBack(_, lease) => limiter.give_back(key, lease).map(|()| Reply::GaveBack),
        }
    }
}

/// What running a [`Step`] answered. `T` is what a take holds, `E` what a part without room
/// answers ([`Lease`] and [`Rejected`] unless the caller's parts answer otherwise).
#[derive(Debug)]
pub enum Reply<T = Lease, E = Rejected> {
    /// A take's answer.
    Took(Result<T, E>),
    /// A check's or a probe's answer.
    Checked(Result<Meta, E>),
    /// What was taken went back.
    GaveBack,
}

/// How one part came out of the call.
#[derive(Debug)]
pub enum PartAnswer<T = Lease, E = Rejected> {
    /// Its permits were taken: the call was granted, or the part is still being decided.
    Taken(T),
    /// It had room, but the call was denied: what it took went back, and this is its state after.
    GivenBack(Meta),
    /// It had no room (the call is denied if the part enforces).
    NoRoom(E),
    /// It was only checked: the call was a check, or an earlier part had denied it.
    Checked(Result<Meta, E>),
    /// Its state was not read, as the caller reports only the denying part's
    /// ([`AllOrNothing::denier_only`]): an earlier part had denied the call and it was not asked,
    /// or what it took was given back and it was not probed.
    Unread,
}

impl<T: PartState, E: PartState> PartAnswer<T, E> {
    /// The part's state as the call left it.
    pub fn meta(&self) -> Meta {
        match self {
            PartAnswer::Taken(taken) => taken.meta(),
            PartAnswer::GivenBack(meta) | PartAnswer::Checked(Ok(meta)) => *meta,
            PartAnswer::NoRoom(denied) | PartAnswer::Checked(Err(denied)) => denied.meta(),
            PartAnswer::Unread => Meta::default(),
        }
    }
}

impl<T, E> PartAnswer<T, E> {
    /// True when the part had no room for the call's permits.
    pub fn is_limited(&self) -> bool {
        matches!(self, PartAnswer::NoRoom(_) | PartAnswer::Checked(Err(_)))
    }
}

/// A call over several parts, decided all-or-nothing.
///
/// It decides nothing itself and does no I/O: it says which [`Step`] to run on which part next,
/// and the caller runs it on its own storage (at once, or awaiting a round trip) and hands back
/// the [`Reply`]. So [`Chain`](crate::Chain), a server's in-memory counters and a store that
/// reaches Redis follow the same rules, written here once:
///
/// 1. parts are taken in order;
/// 2. once a part that *enforces* has no room, the call is denied and the parts after it are only
///    checked (taking and giving back would hold their budget for nothing), or not asked at all
///    when the caller reports only the denying part ([`AllOrNothing::denier_only`], which probes
///    no refunded part either); a part that only counts (a shadow or quota limit) without room
///    denies nothing;
/// 3. a denied call gives back what it took, newest first, so it leaves every part as it was;
/// 4. a part given back reports its state **after** the refund (probed with `n = 0`), so the
///    `remaining` a client is told is what it really has.
///
/// ```
/// use tollgate::{AllOrNothing, Limiter, Quota, TokenBucket};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tollgate::QuotaError> {
/// let parts = [
///     Limiter::new(TokenBucket::new(Quota::per_second(10)?)),
///     Limiter::new(TokenBucket::new(Quota::per_second(1)?)),
/// ];
/// let _ = parts[1].try_acquire(1); // the second has no room left
///
/// let mut call = AllOrNothing::new([true, true]); // both enforce
/// while let Some(step) = call.step() {
///     let i = step.part();
///     // In-process parts answer at once; a distributed one's answer would be awaited.
///     call.reply(step.run(&parts[i], &(), 1).await);
/// }
/// let outcome = call.finish();
/// assert_eq!(outcome.denied_by(), Some(1));
/// assert_eq!(outcome.parts()[0].meta().remaining, 10, "the first got its permit back");
/// # Ok(()) }
/// ```
///
/// A take holds a `T` and a part without room answers an `E`: [`Lease`] and [`Rejected`] for
/// [`RateLimiter`]s ([`Step::run`]). A caller whose parts are not limiters names its own: a tower
/// layer's policies keep their permits beside the call (`T = ()`: a permit moved through every
/// step is copied at each) and deny with the layer's denial. A call of up to two parts allocates
/// nothing.
pub struct AllOrNothing<T = Lease, E = Rejected> {
    enforces: Enforces,
    answers: SmallVec<[PartAnswer<T, E>; INLINE]>,
    denied_by: Option<usize>,
    check_only: bool,
    /// After a denial, no part but the denier is read: later ones are not asked, given-back
    /// ones not probed.
    denier_only: bool,
    /// The step whose reply is awaited.
    waiting: Option<Waiting>,
    /// Once a denied call gives back: the parts below this one are still to look at, newest
    /// first.
    refund_below: Option<usize>,
    /// A part given back, whose state is to be probed next.
    probe: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
enum Waiting {
    Take,
    Check,
    GiveBack(usize),
    Probe(usize),
}

impl<T, E> AllOrNothing<T, E> {
    /// A call that takes from each part; `enforces[i]` says whether part `i` having no room
    /// denies the call (false for a limit that only counts).
    #[inline]
    pub fn new(enforces: impl IntoIterator<Item = bool>) -> AllOrNothing<T, E> {
        let enforces = Enforces::new(enforces);
        AllOrNothing {
            answers: SmallVec::with_capacity(enforces.len),
            enforces,
            denied_by: None,
            check_only: false,
            denier_only: false,
            waiting: None,
            refund_below: None,
            probe: None,
        }
    }

    /// A call that only checks each part (takes nothing); it is denied by the first enforcing
    /// part without room.
    pub fn check(enforces: impl IntoIterator<Item = bool>) -> AllOrNothing<T, E> {
        AllOrNothing { check_only: true, ..AllOrNothing::new(enforces) }
    }

    /// For a caller that reports only the state of the part that denied the call (a tower layer's
    /// 429 names one policy): once an enforcing part has denied it, the parts after it are not
    /// asked instead of checked, and a part given back is not probed: all are
    /// [`PartAnswer::Unread`]. For a distributed part that saves a round trip per denied call.
    /// What was taken is still given back.
    #[must_use]
    pub fn denier_only(self) -> AllOrNothing<T, E> {
        AllOrNothing { denier_only: true, ..self }
    }

    /// The next step to run, or `None` when the call is decided ([`AllOrNothing::finish`]).
    ///
    /// # Panics
    /// When the previous step has not been replied to (a bug in the caller).
    #[inline]
    pub fn step(&mut self) -> Option<Step<T>> {
        if self.waiting.is_some() {
            misuse("AllOrNothing::step called before the previous step's reply");
        }
        let mut next = self.answers.len();
        if self.denier_only && self.denied_by.is_some() {
            while next < self.enforces.len {
                self.answers.push(PartAnswer::Unread);
                next += 1;
            }
        }
        if next < self.enforces.len {
            let (waiting, step) = if self.check_only || self.denied_by.is_some() {
                (Waiting::Check, Step::Check(next))
            } else {
                (Waiting::Take, Step::Take(next))
            };
            self.waiting = Some(waiting);
            return Some(step);
        }
        if let Some(i) = self.probe.take() {
            self.waiting = Some(Waiting::Probe(i));
            return Some(Step::Probe(i));
        }
        // A granted call is done; a denied one gives back what it took first.
        self.denied_by?;
        // Every part is decided and the call denied: what was taken goes back, newest first.
        let below = self.refund_below.get_or_insert(next);
        while *below > 0 {
            *below -= 1;
            let i = *below;
            if matches!(self.answers[i], PartAnswer::Taken(_)) {
                let taken = std::mem::replace(&mut self.answers[i], PartAnswer::GivenBack(Meta::default()));
                let PartAnswer::Taken(taken) = taken else { unreachable!("matched as taken above") };
                self.waiting = Some(Waiting::GiveBack(i));
                return Some(Step::GiveBack(i, taken));
            }
        }
        None
    }

    /// Hands back what running the last [`Step`] answered.
    ///
    /// # Panics
    /// When the reply is not the one the step asks for, or no step is waiting (a bug in the
    /// caller).
    #[inline]
    pub fn reply(&mut self, reply: Reply<T, E>)
    where
        E: PartState,
    {
        match (self.waiting.take(), reply) {
            (Some(Waiting::Take), Reply::Took(Ok(taken))) => self.answers.push(PartAnswer::Taken(taken)),
            (Some(Waiting::Take), Reply::Took(Err(rejected))) => {
                self.deny_if_enforced();
                self.answers.push(PartAnswer::NoRoom(rejected));
            }
            (Some(Waiting::Check), Reply::Checked(checked)) => {
                if checked.is_err() && self.check_only {
                    self.deny_if_enforced();
                }
                self.answers.push(PartAnswer::Checked(checked));
            }
            (Some(Waiting::GiveBack(i)), Reply::GaveBack) if self.denier_only => self.answers[i] = PartAnswer::Unread,
            (Some(Waiting::GiveBack(i)), Reply::GaveBack) => self.probe = Some(i),
            (Some(Waiting::Probe(i)), Reply::Checked(probed)) => {
                self.answers[i] = PartAnswer::GivenBack(probed.unwrap_or_else(|r| r.meta()));
            }
            (waiting, reply) => mismatch(waiting, &reply),
        }
    }

    /// Runs the whole call on parts that answer at once (in-process limiters, counters under a
    /// lock the caller holds): `run` runs each step, and the call finishes.
    ///
    /// ```
    /// use tollgate::{AllOrNothing, Limiter, Quota, TokenBucket};
    /// let parts = [
    ///     Limiter::new(TokenBucket::new(Quota::per_second(10)?)),
    ///     Limiter::new(TokenBucket::new(Quota::per_second(1)?)),
    /// ];
    /// let outcome = AllOrNothing::new([true, true]).run_now(|step| {
    ///     let i = step.part();
    ///     step.run(&parts[i], &(), 2)
    /// });
    /// assert_eq!(outcome.denied_by(), Some(1), "the second holds 1");
    /// assert_eq!(parts[0].statistics().available, 10, "the first got its 2 back");
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    ///
    /// # Panics
    /// When a step's answer is pending (a part that answers later needs [`AllOrNothing::step`]).
    pub fn run_now(mut self, mut run: impl FnMut(Step<T>) -> Answer<Reply<T, E>>) -> Outcome<T, E>
    where
        E: PartState,
    {
        while let Some(step) = self.step() {
            match run(step) {
                Answer::Ready(reply) => self.reply(reply),
                Answer::Pending(_) => misuse("AllOrNothing::run_now: a part answered later"),
            }
        }
        self.finish()
    }

    /// The part whose reply is awaited decided "no room": the call is denied if it enforces and
    /// nothing denied it before.
    fn deny_if_enforced(&mut self) {
        let i = self.answers.len();
        if self.denied_by.is_none() && self.enforces.get(i) {
            self.denied_by = Some(i);
        }
    }

    /// True once an enforcing part has denied the call.
    pub fn is_denied(&self) -> bool {
        self.denied_by.is_some()
    }

    /// How the call came out.
    ///
    /// # Panics
    /// When steps are left to run (a bug in the caller).
    #[inline]
    pub fn finish(self) -> Outcome<T, E> {
        let decided = self.waiting.is_none()
            && self.probe.is_none()
            && self.answers.len() == self.enforces.len
            && (self.denied_by.is_none() || self.refund_below == Some(0));
        if !decided {
            misuse("AllOrNothing::finish called with steps left to run");
        }
        Outcome { parts: self.answers, denied_by: self.denied_by }
    }

    /// Gives up on the call (the storage failed): the leases taken so far, newest first, for the
    /// caller to give back before it reports the failure.
    pub fn abandon(self) -> Vec<(usize, T)> {
        let mut taken: Vec<(usize, T)> = (self.answers.into_iter().enumerate())
            .filter_map(|(i, answer)| match answer {
                PartAnswer::Taken(taken) => Some((i, taken)),
                _ => None,
            })
            .collect();
        taken.reverse();
        taken
    }
}

/// How a call over several parts came out: each part's answer, in order, and which part denied
/// it.
#[derive(Debug)]
#[must_use = "an Outcome holds the leases a granted call took"]
pub struct Outcome<T = Lease, E = Rejected> {
    parts: SmallVec<[PartAnswer<T, E>; INLINE]>,
    denied_by: Option<usize>,
}

impl<T, E> Outcome<T, E> {
    /// True when no enforcing part denied the call: every part with room keeps what it took.
    pub fn is_granted(&self) -> bool {
        self.denied_by.is_none()
    }

    /// The first enforcing part without room, if any.
    pub fn denied_by(&self) -> Option<usize> {
        self.denied_by
    }

    /// Each part's answer, in order.
    pub fn parts(&self) -> &[PartAnswer<T, E>] {
        &self.parts
    }

    /// Each part's answer, in order, owned (the leases of a granted call).
    pub fn into_parts(self) -> impl ExactSizeIterator<Item = PartAnswer<T, E>> {
        self.parts.into_iter()
    }
}

/// Which parts enforce: a bit each for the first 64, the rest (a call of more parts) on the heap.
#[derive(Debug)]
struct Enforces {
    len: usize,
    bits: u64,
    more: Vec<bool>,
}

impl Enforces {
    #[inline]
    fn new(enforces: impl IntoIterator<Item = bool>) -> Enforces {
        let mut all = Enforces { len: 0, bits: 0, more: Vec::new() };
        for enforces in enforces {
            match all.len {
                i @ 0..64 => all.bits |= u64::from(enforces) << i,
                _ => all.more.push(enforces),
            }
            all.len += 1;
        }
        all
    }

    #[inline]
    fn get(&self, i: usize) -> bool {
        match i {
            0..64 => self.bits >> i & 1 == 1,
            _ => self.more[i - 64],
        }
    }
}

/// A caller's bug: steps run out of order.
#[cold]
#[inline(never)]
fn misuse(what: &str) -> ! {
    panic!("{what}")
}

/// A caller's bug: a reply that does not answer the step (what it holds need not be `Debug`).
#[cold]
#[inline(never)]
fn mismatch<T, E>(waiting: Option<Waiting>, reply: &Reply<T, E>) -> ! {
    let reply = match reply {
        Reply::Took(_) => "Reply::Took",
        Reply::Checked(_) => "Reply::Checked",
        Reply::GaveBack => "Reply::GaveBack",
    };
    panic!("AllOrNothing: {reply} does not answer {waiting:?}")
}

impl<T, E> std::fmt::Debug for AllOrNothing<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllOrNothing")
            .field("parts", &self.enforces.len)
            .field("decided", &self.answers.len())
            .field("denied_by", &self.denied_by)
            .field("check_only", &self.check_only)
            .field("waiting", &self.waiting)
            .finish_non_exhaustive()
    }
}
