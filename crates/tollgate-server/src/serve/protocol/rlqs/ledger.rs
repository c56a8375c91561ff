//! Who holds what of each counter's limit: the shares assigned to the Envoy instances whose
//! buckets count on it, until their assignments expire.
//!
//! The rule that keeps the fleet within a limit: a holder's new share is its max-min fair share
//! of the limit among the live holders, and never more than the others leave — what *they* hold
//! now, as Envoy enforces it, not what they will be assigned at their next report. A share that
//! moves from one instance to another is therefore handed out only once its old holder has been
//! told to give it up (at that holder's next report), so the sum of what the assignments in force
//! may admit per window stays within the limit while demand shifts. A share that changes rebuilds
//! an Envoy's token buckets, each starting full on top of what the old one admitted: a change is
//! made only if it fits with those bursts, which are charged for a window (see [`paid`]), so the
//! fleet stays within the limit in any stretch of a window, rebuilds included, however often
//! the shares move; and a want a step less than the one the holder last had is not taken (see
//! [`steady`]), so a wavering want does not move them at every report.
//!
//! RLS callers on the same counter (one call per request, decided against its windows) are one
//! more holder: the ledger reserves in the counter's open window what the assignments in force
//! may admit (counted into it, up to the limit; a window is opened only by RLS decisions), so
//! the RLS callers get only what those leave, and reads their use of the window as its count
//! less that reservation. A new window also holds what the assignments held when it opened and
//! when the last one ended: Envoys admitted by them until then, and RLS callers take their part
//! at a window's start, so a stretch of a window's length across the two would hold both. Holders get no more than the limit less what the others hold and what
//! the RLS callers used of the window; the RLS callers' want (for the fair division) is planned
//! from the last window they used: what they used with a margin, or twice that when the window
//! was full (what a held-back caller uses says too little of what it wants). Why not charge
//! what Envoys report: a report counts admissions since the last one, some from before the
//! window opened, so a fleet alone would find its window full before its end.

use hashbrown::HashMap;
use tollgate_policy::LimitId;

use crate::serve::model::{fair_level, fair_shares};

/// One Envoy instance (a stream), by its number: what holds a share of a counter (its buckets on
/// the counter split it).
pub(crate) type Holder = u64;

/// One counter of one limit, as the RLS counts it: the limit and its variables' values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CounterKey {
    pub(crate) limit: LimitId,
    pub(crate) values: Vec<String>,
}

impl From<&CounterKey> for CounterKey {
    /// A copy made only when a map meets the counter for the first time (`entry_ref`).
    fn from(key: &CounterKey) -> CounterKey {
        key.clone()
    }
}

/// What one holder has of a counter.
#[derive(Clone, Copy, Debug)]
struct Hold {
    /// The hits per window it asked for at its last report.
    want: u64,
    /// The hits per window its assignment in force may admit (bursts included).
    held: u64,
    /// When that assignment expires in Envoy (the server clock's ns), after which it holds
    /// nothing.
    expires_ns: u64,
    /// Its share is less than its fair share at its last report, for lack of room: a claim on
    /// the next windows (see [`Ledger::window_seen`]).
    short: bool,
}

/// A counter's window as the storage shows it when a holder reports: what it counts, and when it
/// ends (on the storage's own scale: the window's identity, compared within half a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) count: u64,
    pub(crate) end: u64,
}

/// The RLS callers' part of a counter, seen through its windows: what RLQS reserved in the window
/// open, and so what the RLS callers took of it (the count less that).
#[derive(Clone, Copy, Debug, Default)]
struct Rls {
    /// The end of the window last seen open; `None` when none was.
    window: Option<u64>,
    /// What RLQS charged into that window: what the assignments in force may admit in it.
    reserved: u64,
    /// What the RLS callers took of that window, as last seen.
    used: u64,
    /// What the RLS callers want per window, as one more holder of the limit: planned from the
    /// last window they used.
    want: u64,
    /// When a window was last seen open, or found left behind (the server clock's ns).
    seen_ns: u64,
    /// What the assignments in force held when the window last seen was left behind: Envoys
    /// admitted by them until then, so the next window (if it opens within a window's time)
    /// holds at least that much reserved.
    floor: u64,
}

impl Rls {
    /// Takes in the window seen at `now_ns` (`None`: none is open) for a limit of `limit` per
    /// window of `window` (ns, the scale of [`Seen::end`] too): what the RLS callers used of it
    /// is then in `used`; `held` is what the assignments in force hold now. For a window seen for
    /// the first time, returns what it must hold reserved at least ([`Rls::floor`], when the
    /// last window was seen within a window's time). When the window last seen is left behind,
    /// the RLS callers' want is planned from it (a window after a time with none keeps the
    /// want); after a whole window's time with none open, they want nothing (RLS callers open a
    /// window with their first hit).
    fn see(&mut self, seen: Option<Seen>, limit: u64, window: u64, now_ns: u64, held: u64) -> Option<u64> {
        let same = match (seen, self.window) {
            (Some(seen), Some(last)) => seen.end.abs_diff(last) < window / 2,
            _ => false,
        };
        if !same {
            if self.window.is_some() {
                // Left behind by now: the holds in force count as the window's last.
                self.want = rls_want(limit, self.used, self.reserved);
                (self.floor, self.seen_ns) = (held, now_ns);
            } else if seen.is_none() && now_ns.saturating_sub(self.seen_ns) >= window {
                self.want = 0;
            }
            (self.window, self.reserved, self.used) = (seen.map(|s| s.end), 0, 0);
        }
        let recent = now_ns.saturating_sub(self.seen_ns) < window;
        if let Some(seen) = seen {
            self.used = self.used.max(seen.count.saturating_sub(self.reserved));
            self.seen_ns = now_ns;
        }
        (!same && seen.is_some()).then_some(if recent { self.floor } else { 0 })
    }

    /// What to count into the window `seen` (none: nothing) so that it holds `held`, what the
    /// assignments in force may admit in it, or, for a window seen for the first time
    /// (`opened`: [`Rls::see`]'s floor), `held_before` (the old share of a holder whose share
    /// was cut now, for the Envoy admitted by it until now) and that floor if more: a stretch of
    /// a window's length that spans the last window's end and this one's start holds both (RLS
    /// callers take their part at a window's start). The rebuilds' bursts of the last window are
    /// admitted in it too. Up to what the window has left; recorded as reserved.
    fn reserve(&mut self, seen: Option<Seen>, opened: Option<u64>, held: u64, held_before: u64, limit: u64) -> u64 {
        let target = opened.map_or(held, |floor| held_before.max(floor));
        let reserve = seen.map_or(0, |seen| target.saturating_sub(self.reserved).min(limit.saturating_sub(seen.count)));
        self.reserved += reserve;
        reserve
    }
}

/// What the RLS callers want per window, after a window in which they used `used` of `limit` and
/// RLQS reserved `reserved`: nothing when they used nothing; twice what they used and a fiftieth
/// of the limit when the window was full (they were held back, so what they used says too
/// little); else what they used, a tenth more and a fiftieth of the limit (the margin an Envoy's
/// want has). At most the limit.
fn rls_want(limit: u64, used: u64, reserved: u64) -> u64 {
    if used == 0 {
        return 0;
    }
    let grid = (limit / 50).max(1);
    let want = if used.saturating_add(reserved).saturating_add(grid) >= limit {
        used.saturating_mul(2).saturating_add(grid)
    } else {
        used.saturating_add(used / 10).saturating_add(grid)
    };
    want.min(limit)
}

/// What a holder that wanted `had` at its last report (`None`: it holds nothing) wants now that
/// it asks `want` of a limit of `limit`: `had` when `want` is less by no more than a step of the
/// wants' grid (a fiftieth of the limit), else `want`. Why: a changed share rebuilds the Envoy's
/// token bucket, which starts full, so each change can add the bucket's burst to a window; a want
/// wavering across a grid step at every report would move its share and the others' at every
/// report (measured: 1.085x the limit in a window, short). A want that grows is taken at once
/// (utilization, convergence), so a want wavering by a step settles at its top. Only the holders'
/// wants: the RLS callers' is read from what they used, and held high it would not come down
/// when they stop, nor held low let them grow from a starved window.
fn steady(had: Option<u64>, want: u64, limit: u64) -> u64 {
    let step = (limit / 50).max(1);
    match had {
        Some(had) if want < had && had - want <= step => had,
        _ => want,
    }
}

/// The share a holder that holds `mine` gets when `target` is its fair share within `room` (the
/// limit less what the others hold, the RLS callers' part and the last window's rebuilds
/// charged), and changing its share rebuilds `rebuild`. A changed share rebuilds the Envoy's
/// token buckets, each starting full on top of what the old one admitted in the window, so a
/// change is made only when the new share and that burst fit in the room together, the burst
/// charged for a window (then the sum of what all Envoys may admit in any stretch of a window,
/// bursts of rebuilt buckets included, stays within what the window has left). A change that
/// does not fit: as much of an increase as fits; else the share is kept (a cut smaller than its
/// charge frees nothing), unless the room no longer holds it (the RLS callers' part grew). The
/// charges never cut a share: the room holds what the holder has (the others' changes and
/// charges fitted beside it), so they only hold increases back, for a window at most, and the
/// shares do not move again because of them. (A share growing into a full room so stays a
/// burst short of its fair share: room for its next rebuild.) A holder that rebuilds its
/// buckets whatever its share ([`Rebuild::resplit`]) pays the same charge, out of its own share
/// when the room lacks it (down to 0 at most, which costs nothing: see [`Rebuild::charge`]).
/// Returns the share, and whether the buckets are rebuilt (and the charge paid).
fn paid(target: u64, mine: u64, room: u64, rebuild: Rebuild) -> (u64, bool) {
    if target == mine && !rebuild.resplit {
        return (target, false);
    }
    if target.saturating_add(rebuild.charge(target)) <= room {
        return (target, true);
    }
    let fits = target.min(rebuild.fitting(room));
    if fits > mine || mine > room || rebuild.resplit { (fits, true) } else { (mine, false) }
}

/// What a holder was given by [`Ledger::share`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    /// The hits per window it now holds.
    pub(crate) share: u64,
    /// What to charge into the window open, so that its count holds what the assignments in
    /// force may admit in it (RLS callers then see it).
    pub(crate) reserve: u64,
    /// The RLS callers alone used the window up: nothing is left until it ends.
    pub(crate) exhausted: bool,
    /// The holder's buckets are rebuilt: its share changed, or it asked to
    /// ([`Rebuild::resplit`]) and the rebuild was charged.
    pub(crate) rebuilt: bool,
}

/// The holders of one counter, and the RLS callers' part of it.
#[derive(Debug, Default)]
struct Counter {
    holds: HashMap<Holder, Hold>,
    rls: Rls,
    /// The rebuilds' bursts charged within the last window: (until when, on the server clock's
    /// ns; how many hits), by `until`, one entry per eighth of a window (see [`charge`]).
    rebuilt: Vec<(u64, u64)>,
}

/// What changing a holder's share rebuilds: its token buckets on the counter, each starting full
/// in Envoy on top of what the old one admitted. Worked out by the caller from the buckets'
/// bursts (`strategy.rs` has the one formula); the ledger and `fair_share.lua` only take it in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rebuild {
    /// The most a change of share may add to a window: bucket by bucket, the larger of the burst
    /// its token bucket has and the most a new one may start with.
    pub(crate) most: u64,
    /// The bursts its token buckets have now.
    pub(crate) held: u64,
    /// The holder rebuilds its buckets even if its share stays as it is (their split of it
    /// moved): charged all the same.
    pub(crate) resplit: bool,
}

impl Rebuild {
    /// What a change to a share of `share` adds to a window at most: no bucket starts with more
    /// than its part of the share, so the old buckets' bursts and the new share bound it too; a
    /// share of 0 starts no bucket (Envoy is told to deny all), so it adds nothing. (Charged for
    /// it, a cut to 0 forced by a room smaller than the old bursts charged more than the room.)
    fn charge(self, share: u64) -> u64 {
        if share == 0 { 0 } else { self.most.min(self.held.saturating_add(share)) }
    }

    /// The largest share whose change, with its charge, fits in `room` (0 when none does).
    fn fitting(self, room: u64) -> u64 {
        room.saturating_sub(self.most).max(room.saturating_sub(self.held) / 2)
    }
}

/// Charges `hits` to `rebuilt` until `until` (ns), rounded up to an eighth of `window`: a charge
/// lasts a window and at most an eighth more, and a window's charges are at most nine entries.
fn charge(rebuilt: &mut Vec<(u64, u64)>, hits: u64, until: u64, window: u64) {
    let slot = (window / 8).max(1);
    let until = until.div_ceil(slot).saturating_mul(slot);
    match rebuilt.last_mut() {
        Some((last, charged)) if *last == until => *charged += hits,
        _ => rebuilt.push((until, hits)),
    }
}

/// The shares of every counter the RLQS streams report on.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    counters: HashMap<CounterKey, Counter>,
    /// The window an RLS decision last showed of each counter ([`Ledger::worth_seeing`]): its
    /// end, and when; those of ended windows are dropped as the map reaches `looked_room`.
    looked: HashMap<CounterKey, (u64, u64)>,
    looked_room: usize,
}

impl Ledger {
    /// Gives `holder` its share of `counter` (whose limit is `limit` hits per window of
    /// `window` on the scale of `seen`'s ends) now that it wants `want`, the counter's window
    /// being `seen` (`None`: none is open; a want a step less than its last is not taken, see
    /// [`steady`]): its max-min fair share among the counter's live
    /// holders and the RLS callers (as one more holder, wanting what [`rls_want`] says), capped
    /// by what the others' assignments in force, the RLS callers' fair share or use of the
    /// window (whichever is more) and the rebuilds of the last window leave. A change of share pays for what it rebuilds
    /// (`rebuild`, see [`paid`]) or is not made.
    /// Records it as what the holder holds until `expires_ns`, and the reservation it asks for
    /// as charged. (`fair_share.lua` applies the same rule to holders on several servers.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn share(
        &mut self,
        counter: &CounterKey,
        limit: u64,
        holder: Holder,
        want: u64,
        rebuild: Rebuild,
        seen: Option<Seen>,
        window: u64,
        now_ns: u64,
        expires_ns: u64,
    ) -> Taken {
        let entry = self.counter(counter);
        entry.holds.retain(|h, hold| hold.expires_ns > now_ns || *h == holder);
        entry.rebuilt.retain(|&(until, _)| until > now_ns);
        let rebuilt: u64 = entry.rebuilt.iter().map(|&(_, hits)| hits).sum();
        let live = entry.holds.get(&holder).filter(|hold| hold.expires_ns > now_ns);
        let mine = live.map_or(0, |hold| hold.held);
        let want = steady(live.map(|hold| hold.want), want, limit);
        let others: u64 = entry.holds.iter().filter(|(h, _)| **h != holder).map(|(_, hold)| hold.held).sum();
        let opened = entry.rls.see(seen, limit, window, now_ns, others + mine + rebuilt);
        let used = entry.rls.used;
        let mut wants = vec![want];
        wants.extend(entry.holds.iter().filter(|(h, _)| **h != holder).map(|(_, hold)| hold.want));
        wants.push(entry.rls.want);
        let shares = fair_shares(limit, &wants);
        let (fair, rls_fair) = (shares[0], shares[shares.len() - 1]);
        // The rebuilds' charges are the Envoys' to pay: the room leaves the RLS callers their
        // fair part of the window (or what they used, if more).
        let room = limit.saturating_sub(others).saturating_sub(used.max(rls_fair)).saturating_sub(rebuilt);
        let (share, rebuilds) = paid(fair.min(room), mine, room, rebuild);
        entry.holds.insert(holder, Hold { want, held: share, expires_ns, short: share < fair });
        let charged = if rebuilds { rebuild.charge(share) } else { 0 };
        if charged > 0 {
            charge(&mut entry.rebuilt, charged, now_ns.saturating_add(window), window);
        }
        let rebuilt = rebuilt + charged;
        let reserve =
            entry.rls.reserve(seen, opened, others + share + rebuilt, others + share.max(mine) + rebuilt, limit);
        Taken { share, reserve, exhausted: used >= limit, rebuilt: rebuilds }
    }

    /// Whether `counter`'s window, which an RLS decision at `now_ns` shows ending at `end` (on
    /// [`Seen::end`]'s scale), is to be seen ([`Ledger::window_seen`]): the counter is held (here,
    /// or, with `elsewhere`, maybe by another server's holders: on Redis), and the window is new
    /// or was last shown an eighth of a window (`window`) ago or more, so a window is seen a few
    /// times, not at every call.
    pub(crate) fn worth_seeing(
        &mut self,
        counter: &CounterKey,
        end: u64,
        window: u64,
        now_ns: u64,
        elsewhere: bool,
    ) -> bool {
        if !elsewhere && !self.counters.contains_key(counter) {
            return false;
        }
        if let Some(&(last, at)) = self.looked.get(counter)
            && last.abs_diff(end) < window / 2
            && now_ns.saturating_sub(at) < window / 8
        {
            return false;
        }
        if self.looked.len() >= self.looked_room {
            // Seen windows that ended are done with: the map holds about the counters whose
            // windows are open, whatever many counters come and go.
            self.looked.retain(|_, &mut (end, _)| end > now_ns);
            self.looked_room = (2 * self.looked.len()).max(1_024);
        }
        self.looked.insert(counter.clone(), (end, now_ns));
        true
    }

    /// Sees `counter`'s window as an RLS decision left it (`seen`), when it opened it, found it
    /// full or came in its last eighth, as a report would. Returns what to reserve in it so that
    /// it holds what the assignments in force may admit in it (and, for a window seen for the
    /// first time, what they held when the last one ended), and, for each holder given less than
    /// its fair share at its last report for lack of room, its fair share now: its claim. Why
    /// the claims: a holder's share can grow only by what the RLS callers leave of the window open at its
    /// report (see [`Ledger::share`]); in windows shorter than the report interval, RLS callers
    /// wanting more than their fair part take all that the holders do not hold early in each
    /// window, so a report lands in a window used up at the same point every time and a holder
    /// that holds nothing never gets anything (measured: an Envoy held 0 of a limit per 1 s
    /// beside RLS callers and another Envoy, reporting every 5 s). Claimed, it is held back from
    /// the RLS callers until that report, which gives it. 0 for a counter no holder holds, or a
    /// window already seen (whose use by the RLS callers is now seen: all they were left, for
    /// one found full).
    pub(crate) fn window_seen(
        &mut self,
        counter: &CounterKey,
        limit: u64,
        seen: Seen,
        window: u64,
        now_ns: u64,
    ) -> u64 {
        let Some(entry) = self.counters.get_mut(counter) else { return 0 };
        entry.holds.retain(|_, hold| hold.expires_ns > now_ns);
        entry.rebuilt.retain(|&(until, _)| until > now_ns);
        let rebuilt: u64 = entry.rebuilt.iter().map(|&(_, hits)| hits).sum();
        if entry.holds.is_empty() && rebuilt == 0 {
            return 0;
        }
        let held = entry.holds.values().map(|hold| hold.held).sum::<u64>() + rebuilt;
        let opened = entry.rls.see(Some(seen), limit, window, now_ns, held);
        let mut wants: Vec<u64> = entry.holds.values().map(|hold| hold.want).collect();
        wants.push(entry.rls.want);
        // Each one's fair share as the level of the division says (no odd unit: as
        // `fair_share.lua` works it out).
        let level = fair_level(limit, &wants).unwrap_or(u64::MAX);
        let short = |hold: &Hold| if hold.short { hold.want.min(level).saturating_sub(hold.held) } else { 0 };
        let shortfall: u64 = entry.holds.values().map(short).sum();
        // The claims leave the RLS callers their fair part: they come out of the rest only.
        let rls_fair = entry.rls.want.min(level);
        let claimed = held + shortfall.min(limit.saturating_sub(rls_fair).saturating_sub(held));
        entry.rls.reserve(Some(seen), opened, claimed, claimed, limit)
    }

    /// Records that `holder` holds `share` of `counter` until `expires_ns` (a share
    /// `fair_share.lua` decided: this server's view of it, for its metrics), forgetting what
    /// expired by `now_ns`.
    pub(crate) fn record(
        &mut self,
        counter: &CounterKey,
        holder: Holder,
        want: u64,
        share: u64,
        now_ns: u64,
        expires_ns: u64,
    ) {
        let holds = &mut self.counter(counter).holds;
        holds.retain(|_, hold| hold.expires_ns > now_ns);
        holds.insert(holder, Hold { want, held: share, expires_ns, short: false });
    }

    /// The rebuilds' bursts charged to `counter` and still in force.
    #[cfg(test)]
    pub(crate) fn charged(&self, counter: &CounterKey) -> u64 {
        self.counters.get(counter).map_or(0, |c| c.rebuilt.iter().map(|&(_, hits)| hits).sum())
    }

    /// The holders of `counter`, none yet when it is new.
    fn counter(&mut self, counter: &CounterKey) -> &mut Counter {
        self.counters.entry_ref(counter).or_default()
    }

    /// Forgets what `instance` holds: its stream ended cleanly, so it enforces nothing more.
    /// (A stream that broke keeps its holds until they expire: Envoy keeps enforcing its
    /// assignments until their time to live ends.)
    pub(crate) fn release(&mut self, instance: u64) {
        self.counters.retain(|_, counter| {
            counter.holds.retain(|h, _| *h != instance);
            !counter.holds.is_empty() || !counter.rebuilt.is_empty()
        });
    }

    /// Drops what has expired by `now_ns`, and counters nobody holds.
    pub(crate) fn expire(&mut self, now_ns: u64) {
        self.counters.retain(|_, counter| {
            counter.holds.retain(|_, h| h.expires_ns > now_ns);
            counter.rebuilt.retain(|&(until, _)| until > now_ns);
            !counter.holds.is_empty() || !counter.rebuilt.is_empty()
        });
    }

    /// For the counters of `limit`: how many distinct instances hold a share, and the hits per
    /// window their assignments may admit in all.
    pub(crate) fn limit_totals(&self, limit: LimitId) -> (usize, u64) {
        let mut instances: Vec<u64> = Vec::new();
        let mut held = 0u64;
        for (key, counter) in &self.counters {
            if key.limit != limit {
                continue;
            }
            for (holder, hold) in &counter.holds {
                instances.push(*holder);
                held = held.saturating_add(hold.held);
            }
        }
        instances.sort_unstable();
        instances.dedup();
        (instances.len(), held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter() -> CounterKey {
        CounterKey { limit: LimitId(7), values: vec!["a".into()] }
    }

    fn holder(instance: u64) -> Holder {
        instance
    }

    #[test]
    fn a_newcomer_gets_only_what_the_others_do_not_hold_until_they_give_it_up() {
        let mut ledger = Ledger::default();
        let c = counter();
        let mut share =
            |h, want, now| ledger.share(&c, 90, holder(h), want, Rebuild::default(), None, 100, now, 1_000).share;
        assert_eq!(share(1, 200, 0), 90, "alone: all of it");
        assert_eq!(share(2, 200, 0), 0, "1 holds all until it reports");
        assert_eq!(share(1, 200, 10), 45, "1 is cut to its fair share");
        assert_eq!(share(2, 200, 20), 45, "then 2 gets the rest");
        assert_eq!(share(1, 10, 30), 10, "1 wants less");
        assert_eq!(share(2, 200, 40), 80, "2 gets what 1 left");
    }

    #[test]
    fn a_want_a_step_less_than_the_last_is_not_taken_and_a_larger_one_is_at_once() {
        let mut ledger = Ledger::default();
        let c = counter();
        // A limit of 1,000: a step of the wants' grid is 20.
        let mut share =
            |h, want, now| ledger.share(&c, 1_000, holder(h), want, Rebuild::default(), None, 100, now, 10_000).share;
        assert_eq!(share(1, 240, 0), 240);
        assert_eq!(share(2, 1_000, 0), 760);
        assert_eq!(share(1, 220, 10), 240, "a step less: 240 still");
        assert_eq!(share(2, 1_000, 20), 760, "1 wants 240 still");
        assert_eq!(share(1, 200, 30), 200, "two steps less: taken");
        assert_eq!(share(2, 1_000, 40), 800, "what 1 gave up");
        assert_eq!(share(1, 220, 50), 200, "more at once, but 2 holds 800");
        assert_eq!(share(2, 1_000, 60), 780);
        assert_eq!(share(1, 220, 70), 220);
        // An expired hold has no last want.
        assert_eq!(share(1, 200, 20_000), 200, "alone, and its 220 long expired");
    }

    #[test]
    fn a_change_of_share_fits_with_the_bursts_it_rebuilds_charged_for_a_window_or_is_not_made() {
        let mut ledger = Ledger::default();
        let c = counter();
        // A limit of 1,000 per window of 1,000 ns; each holder's one token bucket has a burst of
        // 8 (none before its first share).
        let first = Rebuild { most: 8, held: 0, resplit: false };
        let again = Rebuild { most: 8, held: 8, resplit: false };
        let mut share =
            |h, want, rebuild, now| ledger.share(&c, 1_000, holder(h), want, rebuild, None, 1_000, now, 100_000).share;
        assert_eq!(share(1, 1_000, first, 0), 992, "alone: all of it but the burst its new bucket starts with");
        assert_eq!(share(2, 1_000, first, 0), 0, "1 holds the rest");
        assert_eq!(share(1, 1_000, again, 10), 500, "1 is cut to its fair share, its rebuild charged");
        assert_eq!(share(2, 1_000, first, 20), 476, "2 gets what 1 gave up less the two charges and its own");
        assert_eq!(share(2, 1_000, again, 30), 476, "nothing more fits with another rebuild: kept");
        assert_eq!(share(1, 980, again, 40), 500, "a want of a step less is not taken");
        assert_eq!(share(1, 960, again, 50), 500, "its fair share is unchanged: kept, nothing charged");
        // A charge lasts a window, rounded up to an eighth of one: those of 10 and 20 until
        // 1,125, when 2 grows into what they held, less its own rebuild's.
        assert_eq!(share(2, 1_000, again, 1_124), 476);
        assert_eq!(share(2, 1_000, again, 1_125), 492, "1 holds 500, 2 keeps room for its burst");
        assert_eq!(ledger.counters[&c].rebuilt, [(2_125, 8)], "2's rebuild at 1,125, for a window");
    }

    #[test]
    fn a_split_moved_at_an_unchanged_share_is_charged_and_paid_out_of_the_share_when_the_room_lacks_it() {
        let mut ledger = Ledger::default();
        let c = counter();
        // A limit of 1,000 per window of 1,000 ns; holder 1's two token buckets have bursts of 8.
        let keep = Rebuild { most: 16, held: 16, resplit: false };
        let resplit = Rebuild { resplit: true, ..keep };
        let mut share =
            |h, want, rebuild, now| ledger.share(&c, 1_000, holder(h), want, rebuild, None, 1_000, now, 100_000).share;
        assert_eq!(share(1, 400, keep, 0), 400, "a share of 400 in a room of 1,000: its rebuild fits");
        assert_eq!(share(1, 400, keep, 10), 400, "unchanged, split unchanged: nothing charged");
        assert_eq!(share(1, 400, resplit, 20), 400, "unchanged, split moved: the charge fits beside it");
        assert_eq!(share(2, 1_000, keep, 30), 600 - 16 - 16 - 16, "2 gets the rest less the three charges and its own");
        assert_eq!(share(1, 400, resplit, 40), 400 - 16, "no room for the charge: paid out of 1's share");
        assert_eq!(ledger.counters[&c].rebuilt, [(1_000, 16), (1_125, 16 * 3)], "four rebuilds, for a window each");
    }

    /// A window is seen when it is new or an eighth of a window after it was last seen; in
    /// memory only for a counter held here, on Redis (`elsewhere`) for any; the windows of
    /// counters that come and go are forgotten once they ended.
    #[test]
    fn a_window_is_seen_a_few_times_and_forgotten_once_it_ended() {
        let mut ledger = Ledger::default();
        let c = counter();
        // A window of 800 ending at 1_000.
        assert!(!ledger.worth_seeing(&c, 1_000, 800, 200, false), "no holder here");
        assert!(ledger.worth_seeing(&c, 1_000, 800, 200, true), "maybe one on another server");
        assert!(!ledger.worth_seeing(&c, 1_000, 800, 250, true), "within an eighth");
        assert!(ledger.worth_seeing(&c, 1_000, 800, 300, true), "an eighth later");
        assert!(ledger.worth_seeing(&c, 1_800, 800, 310, true), "a new window");
        ledger.share(&c, 90, holder(1), 10, Rebuild::default(), None, 800, 320, 10_000);
        assert!(ledger.worth_seeing(&c, 1_800, 800, 420, false), "held here");
        // Thousands of counters whose windows end at 2_000: the map keeps only open windows.
        for i in 0..5_000 {
            let other = CounterKey { limit: LimitId(8), values: vec![i.to_string()] };
            assert!(ledger.worth_seeing(&other, 2_000, 800, 1_500 + i / 10, true));
        }
        assert!(ledger.looked.len() > 1_024, "{}", ledger.looked.len());
        let late = CounterKey { limit: LimitId(8), values: vec!["late".into()] };
        // The map's room doubles from 1,024 as it fills with open windows (8,192 now): the next
        // time it fills, the ended ones go.
        for i in 0..4_000 {
            let other = CounterKey { values: vec![format!("late-{i}")], ..late.clone() };
            assert!(ledger.worth_seeing(&other, 3_000, 800, 2_500, true));
        }
        assert!(ledger.looked.len() <= 4_000, "the ended windows were dropped: {}", ledger.looked.len());
    }

    #[test]
    fn a_released_or_expired_share_goes_back_to_the_others() {
        let mut ledger = Ledger::default();
        let c = counter();
        for i in 1..=3 {
            ledger.record(&c, holder(i), 200, 30, 0, if i == 3 { 500 } else { 1_000 });
        }
        assert_eq!(ledger.limit_totals(LimitId(7)), (3, 90));
        assert_eq!(ledger.share(&c, 90, holder(1), 200, Rebuild::default(), None, 100, 100, 1_000).share, 30);
        ledger.release(2);
        assert_eq!(
            ledger.share(&c, 90, holder(1), 200, Rebuild::default(), None, 100, 100, 1_000).share,
            45,
            "2 ended its stream: half of what 3 leaves"
        );
        assert_eq!(
            ledger.share(&c, 90, holder(1), 200, Rebuild::default(), None, 100, 600, 1_000).share,
            90,
            "3's assignment expired"
        );
        ledger.expire(2_000);
        assert_eq!(ledger.limit_totals(LimitId(7)), (0, 0));
    }

    #[test]
    fn rls_callers_are_one_more_holder_seen_through_the_windows_count() {
        let mut ledger = Ledger::default();
        let c = counter();
        let window = 1_000;
        let seen = |count, end| Some(Seen { count, end });
        let mut share = |h, count: Option<Seen>, now| {
            let taken = ledger.share(&c, 90, holder(h), 200, Rebuild::default(), count, window, now, 10_000);
            // Whether the buckets are rebuilt is another test's.
            Taken { rebuilt: false, ..taken }
        };
        // No window open: nothing to reserve, all to 1.
        assert_eq!(share(1, None, 0), Taken { share: 90, reserve: 0, exhausted: false, rebuilt: false });
        // RLS callers opened a window and took 6: 1 still holds 90, which the window cannot hold
        // past its limit, so the reservation fills it.
        assert_eq!(share(1, seen(6, 1_000), 10), Taken { share: 84, reserve: 84, exhausted: false, rebuilt: false });
        // 2 comes: 1 holds 84, nothing is left.
        assert_eq!(share(2, seen(90, 1_000), 20), Taken { share: 0, reserve: 0, exhausted: false, rebuilt: false });
        // A new window: the RLS callers were held back after 6 (6 + 84 is the limit), so they
        // want 2 x 6 + 1 = 13; the 77 left is split between 1 and 2, each getting 39 as it
        // reports (the odd unit goes to the one asking). The new window holds 1's old 84 still:
        // Envoy admitted by it until now, in a stretch that reaches into this window.
        assert_eq!(share(1, seen(0, 2_000), 1_000), Taken { share: 39, reserve: 84, exhausted: false, rebuilt: false });
        // The RLS callers took 3 more: 2 gets 38, within what is reserved already (its fair 39
        // with the odd unit, but 1 holds that unit, and the RLS callers' 13 are theirs).
        assert_eq!(share(2, seen(87, 2_000), 1_010), Taken { share: 38, reserve: 0, exhausted: false, rebuilt: false });
        assert_eq!(ledger.counters[&counter()].rls.reserved, 84);
        // The RLS callers use up a window on their own: nothing is left until it ends.
        let t = ledger.share(&c, 90, holder(1), 200, Rebuild::default(), seen(90, 3_100), window, 3_000, 10_000);
        assert_eq!(t, Taken { share: 0, reserve: 0, exhausted: true, rebuilt: true });
    }

    #[test]
    fn a_window_an_rls_decision_opens_holds_the_shares_and_the_claims_of_holders_the_rls_callers_kept_short() {
        let mut ledger = Ledger::default();
        let c = counter();
        let window = 1_000;
        let seen = |count, end| Seen { count, end };
        // No one holds the counter: nothing to reserve in the window an RLS call opens.
        assert_eq!(ledger.window_seen(&c, 90, seen(1, 1_000), window, 0), 0);
        // The RLS callers used 80 of it: 1, wanting it all, gets the 10 left, short of its fair
        // share for lack of room.
        let t = ledger.share(&c, 90, holder(1), 200, Rebuild::default(), Some(seen(80, 1_000)), window, 100, 100_000);
        assert_eq!((t.share, t.reserve), (10, 10));
        // The window is found full: nothing more to reserve.
        assert_eq!(ledger.window_seen(&c, 90, seen(90, 1_000), window, 500), 0);
        // The next window, opened by an RLS call: the RLS callers were held back after 80, so
        // they want it all (2 x 80 + 1, at most 90); fair is 45 each. Reserved at once: 1's 10
        // and its claim up to its fair 45 (the RLS callers keep their 45). Without the claim
        // the RLS callers would take 80 again before 1's report, and 1 would stay at 10.
        assert_eq!(ledger.window_seen(&c, 90, seen(1, 2_000), window, 1_000), 45);
        // 1 reports in that window, which the RLS callers filled: it gets its 45, reserved already.
        let t = ledger.share(&c, 90, holder(1), 200, Rebuild::default(), Some(seen(90, 2_000)), window, 1_100, 100_000);
        assert_eq!((t.share, t.reserve), (45, 0));
        // A window after it holds 1's 45, no claim.
        assert_eq!(ledger.window_seen(&c, 90, seen(1, 3_000), window, 2_000), 45);
    }

    #[test]
    fn a_window_that_opens_after_a_cut_holds_what_was_held_when_the_last_one_ended() {
        let mut ledger = Ledger::default();
        let c = counter();
        let seen = |count, end| Some(Seen { count, end });
        let mut share = |h, seen: Option<Seen>, now| {
            let taken = ledger.share(&c, 90, holder(h), 200, Rebuild::default(), seen, 1_000, now, 10_000);
            // Whether the buckets are rebuilt is another test's.
            Taken { rebuilt: false, ..taken }
        };
        for (h, now) in [(1, 0), (2, 10), (1, 20), (2, 30)] {
            share(h, None, now);
        }
        // RLS callers open a window and take 5: 1 is cut to 40, and the window holds 1's old 45
        // and 2's 45 (all that is left).
        assert_eq!(share(1, seen(5, 1_040), 40), Taken { share: 40, reserve: 85, exhausted: false, rebuilt: false });
        // The window ends; 2 reports before the next opens, and is cut to 39 (the RLS callers,
        // held back, now want 11, and 1 holds the odd unit of the 79 left).
        assert_eq!(share(2, None, 1_040), Taken { share: 39, reserve: 0, exhausted: false, rebuilt: false });
        // The next window holds 2's old 45 too: 2's Envoy admitted by it until it reported.
        assert_eq!(share(1, seen(3, 2_050), 1_050), Taken { share: 40, reserve: 85, exhausted: false, rebuilt: false });
    }

    /// `fair_share.lua` decides as the ledger does: the same shares, reservations and
    /// exhausted windows for the same steps, with holders coming, wanting more or less, and
    /// going quiet (their assignments expiring), changes of share charged for what they rebuild
    /// (or not made), and RLS callers taking from the counter's windows (opened by their first
    /// hit, as the RLS decisions open them). Without RLS callers, what the holders hold and the
    /// last window's rebuilds never exceed the limit.
    #[test]
    fn the_script_on_redis_gives_the_ledgers_shares() {
        use proptest::prelude::*;
        use tollgate::{Clock, ManualClock};
        use tollgate_redis::counters::{ShareAsk, see_window, take_share};
        use tollgate_redis::{Redis, RedisTime};

        let server = tollgate_testkit::RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let redis = runtime.block_on(Redis::connect(&server.url())).unwrap();
        let ttl = std::time::Duration::from_secs(2);
        let window = std::time::Duration::from_secs(1);
        let window_ns = window.as_nanos() as u64;
        // Where a window's key expires past its end on a manual clock (`RedisTime`'s shift for a
        // clock at 1970), as the RLS decisions write it.
        let shift_ms = 1u64 << 44;
        let step = (
            0u64..4,
            0u64..300,
            0u64..1_500,
            prop_oneof![Just(0u64), 1u64..120],
            prop_oneof![Just((0u64, 0u64, false)), (0u64..20, 0u64..20, any::<bool>())],
            any::<bool>(),
        );
        let cases = std::sync::atomic::AtomicU64::new(0);
        proptest!(ProptestConfig::with_cases(64), |(limit in 1u64..200, steps in proptest::collection::vec(step, 1..30))| {
            let key = format!("case{}", cases.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let window_key = format!("{key}:window");
            let clock = ManualClock::new();
            let time = RedisTime::clock(clock.clone());
            let mut ledger = Ledger::default();
            // The counter's open window, (count, end ns): the same on both sides while the
            // ledger and the script reserve the same.
            let mut open: Option<(u64, u64)> = None;
            for (h, want, advance_ms, rls, (held, more, resplit), looks) in steps {
                let rebuild = Rebuild { most: held + more, held, resplit };
                clock.advance(std::time::Duration::from_millis(advance_ms));
                let now = clock.now();
                if open.is_some_and(|(_, end)| end <= now) {
                    open = None;
                }
                if rls > 0 {
                    let (count, end) = open.unwrap_or((0, now + window_ns));
                    let taken = rls.min(limit.saturating_sub(count));
                    if count + taken > 0 {
                        open = Some((count + taken, end));
                        let set = tollgate_redis::redis::cmd("SET")
                            .arg(&window_key)
                            .arg(count + taken)
                            .arg("PXAT")
                            .arg(end / 1_000_000 + shift_ms)
                            .clone();
                        runtime.block_on(redis.query::<String>(&set)).unwrap();
                    }
                }
                // The RLS decision that took those hits sees the window (it opened it, found it
                // full or came near its end), before the holder reports.
                if let Some((count, end)) = open.as_mut().filter(|_| looks) {
                    let ours = ledger.window_seen(&counter(), limit, Seen { count: *count, end: *end }, window_ns, now);
                    let theirs = runtime.block_on(see_window(&redis, &key, &window_key, limit, window, &time)).unwrap();
                    prop_assert_eq!(ours, theirs, "reserved when seen: limit {}, window {:?}", limit, (*count, *end));
                    *count += ours;
                }
                let seen = open.map(|(count, end)| Seen { count, end });
                let expires = now + ttl.as_nanos() as u64;
                let ours = ledger.share(&counter(), limit, holder(h), want, rebuild, seen, window_ns, now, expires);
                let holder_name = format!("h{h}");
                let (rebuild_most, rebuild_held) = (rebuild.most, rebuild.held);
                let ask = ShareAsk {
                    holders: &key,
                    counter: &window_key,
                    holder: &holder_name,
                    limit,
                    window,
                    want,
                    rebuild_most,
                    rebuild_held,
                    resplit,
                    ttl,
                };
                let theirs = runtime.block_on(take_share(&redis, &ask, &time)).unwrap();
                let what = format!("holder {h} wanting {want} of {limit}, window {open:?}");
                prop_assert_eq!(ours.share, theirs.share, "share: {}", what);
                prop_assert_eq!(ours.reserve, theirs.reserved, "reserved: {}", what);
                prop_assert_eq!(ours.exhausted, theirs.exhausted, "exhausted: {}", what);
                prop_assert_eq!(ours.rebuilt, theirs.rebuilt, "rebuilt: {}", what);
                prop_assert!(theirs.held <= limit.max(theirs.share), "{:?}", theirs);
                let entry = &ledger.counters[&counter()];
                if entry.rls.used == 0 {
                    let held: u64 = entry.holds.values().filter(|hold| hold.expires_ns > now).map(|hold| hold.held).sum();
                    let rebuilt: u64 = entry.rebuilt.iter().map(|&(_, hits)| hits).sum();
                    prop_assert!(held + rebuilt <= limit, "held {} and rebuilt {} past the limit: {}", held, rebuilt, what);
                }
                if let Some((count, _)) = open.as_mut() {
                    *count += ours.reserve;
                    let stored: u64 = runtime.block_on(redis.query(tollgate_redis::redis::cmd("GET").arg(&window_key))).unwrap();
                    prop_assert_eq!(stored, *count, "the window's count: {}", what);
                    prop_assert!(*count <= limit, "reserved past the limit: {}", what);
                }
            }
        });
    }
}
