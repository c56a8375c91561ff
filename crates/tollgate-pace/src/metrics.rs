//! The pacer's and the pump's metrics, through the `metrics` facade, labelled by the pacer's name
//! ([`crate::PacerBuilder::name`]): the rate and ceiling, throttling, units spent, and the pump's
//! items by outcome, in flight, and its queue calls tried again.
//!
//! Handles are registered once, when the [`crate::Pacer`] is built, with the recorder installed
//! then; the pump records into its pacer's.

use metrics::{Counter, Gauge, counter, describe_counter, describe_gauge, gauge};

const RATE: &str = "tollgate_pacer_rate";
const CEILING: &str = "tollgate_pacer_ceiling";
const THROTTLED: &str = "tollgate_pacer_throttled_total";
const UNITS: &str = "tollgate_pacer_units_total";
const ITEMS: &str = "tollgate_pump_items_total";
const IN_FLIGHT: &str = "tollgate_pump_in_flight";
const QUEUE_RETRIES: &str = "tollgate_pump_queue_retries_total";

/// What the pump made of an attempt.
#[derive(Clone, Copy)]
pub(crate) enum ItemOutcome {
    Done = 0,
    Throttled = 1,
    Failed = 2,
    Dead = 3,
    Unacknowledged = 4,
}

/// One pacer's handles.
pub(crate) struct PaceMetrics {
    pub(crate) rate: Gauge,
    pub(crate) ceiling: Gauge,
    pub(crate) throttled: Counter,
    pub(crate) units: Counter,
    items: [Counter; 5],
    pub(crate) in_flight: Gauge,
    pub(crate) queue_retries: Counter,
}

impl PaceMetrics {
    pub(crate) fn new(pacer: &str) -> PaceMetrics {
        describe_gauge!(RATE, "The rate a pacer spends at now, in units per second.");
        describe_gauge!(CEILING, "The most a pacer may spend, in units per second (budget or partitions' share).");
        describe_counter!(THROTTLED, "Throttling signals a pacer was given (429/503 or errors classified so).");
        describe_counter!(UNITS, "Units a pacer let be spent.");
        describe_counter!(
            ITEMS,
            "Attempts the work pump made, by outcome (done, throttled, failed, dead, unacknowledged: done but \
             the queue never took the acknowledgement, so it will be done again)."
        );
        describe_gauge!(IN_FLIGHT, "Items the work pump is handling now.");
        describe_counter!(QUEUE_RETRIES, "Queue calls the work pump tried again after an error that may pass.");
        let name = || pacer.to_owned();
        PaceMetrics {
            rate: gauge!(RATE, "pacer" => name()),
            ceiling: gauge!(CEILING, "pacer" => name()),
            throttled: counter!(THROTTLED, "pacer" => name()),
            units: counter!(UNITS, "pacer" => name()),
            items: ["done", "throttled", "failed", "dead", "unacknowledged"]
                .map(|outcome| counter!(ITEMS, "pacer" => name(), "outcome" => outcome)),
            in_flight: gauge!(IN_FLIGHT, "pacer" => name()),
            queue_retries: counter!(QUEUE_RETRIES, "pacer" => name()),
        }
    }

    pub(crate) fn item(&self, outcome: ItemOutcome) {
        self.items[outcome as usize].increment(1);
    }
}

impl std::fmt::Debug for PaceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaceMetrics").finish_non_exhaustive()
    }
}
