//! The pacer's and the pump's metrics after real work (the pacer on a manual clock, the pump on a
//! real redis-server), read back from a Prometheus recorder installed for the test alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tollgate::ManualClock;
use tollgate_pace::{Budget, Handled, HandlerError, Pacer, Progress, PumpOptions, Queue, RedisStreams, pump};
use tollgate_redis::Redis;
use tollgate_testkit::RedisServer;

/// The value of the series `name{labels}` in the Prometheus text, `None` when it is not there.
fn value(metrics: &PrometheusHandle, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}}");
    metrics.render().lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (s, v) = line.rsplit_once(' ')?;
        (s == series).then(|| v.parse().unwrap())
    })
}

#[tokio::test(flavor = "current_thread")]
async fn the_pacer_reports_its_rate_ceiling_throttling_and_units_spent() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let clock = ManualClock::new();
    let pacer = metrics::with_local_recorder(&recorder, || {
        Pacer::builder(Budget::per_second(100).unwrap()).name("orders").clock(clock.clone()).build().unwrap()
    });
    let get = |name: &str| value(&metrics, name, "pacer=\"orders\"");
    assert_eq!(get("tollgate_pacer_rate"), Some(100.0));
    assert_eq!(get("tollgate_pacer_ceiling"), Some(100.0));

    pacer.acquire(15).await.unwrap();
    pacer.throttled(None);
    pacer.throttled(None); // within the same slice: one cut, two signals
    assert_eq!(get("tollgate_pacer_units_total"), Some(15.0));
    assert_eq!(get("tollgate_pacer_throttled_total"), Some(2.0));
    assert_eq!(get("tollgate_pacer_rate"), Some(70.0));
    pacer.set_ceiling(50.0);
    assert_eq!(get("tollgate_pacer_ceiling"), Some(50.0));
    assert_eq!(get("tollgate_pacer_rate"), Some(50.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pump_counts_items_by_outcome_and_what_is_in_flight() {
    let server = RedisServer::start();
    let redis = Redis::connect(&server.url()).await.unwrap();
    // One attempt: a failed item is dead-lettered at once, with no idle timeout to wait for.
    let queue = Arc::new(RedisStreams::open(&redis, "jobs", Duration::from_secs(5), 1).await.unwrap());
    for key in ["ok", "throttled-once", "fails", "held"] {
        queue.enqueue(key, "{}", 1).await.unwrap();
    }
    let recorder = PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let pacer = metrics::with_local_recorder(&recorder, || {
        Arc::new(Pacer::builder(Budget::per_second(1000).unwrap()).name("jobs").build().unwrap())
    });
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let throttled = Arc::new(AtomicBool::new(false));
    let mut options = PumpOptions::new("w");
    options.concurrency = 1; // so that "in flight" while "held" runs is exactly 1
    options.empty_poll = Duration::from_millis(20);
    let progress = Arc::new(Progress::default());
    let running = tokio::spawn({
        let (queue, pacer, release) = (queue.clone(), pacer.clone(), release.clone());
        pump(queue, pacer, options, progress, move |item| {
            let (started, release, throttled) = (started_tx.clone(), release.clone(), throttled.clone());
            async move {
                match item.key.as_str() {
                    "throttled-once" if !throttled.swap(true, Ordering::SeqCst) => Handled::Throttled(None),
                    "fails" => Handled::Failed(HandlerError::message("refused")),
                    "held" => {
                        started.send(()).unwrap();
                        release.notified().await;
                        Handled::Done
                    }
                    _ => Handled::Done,
                }
            }
        })
    });
    started.recv().await.unwrap();
    let get = |name: &str, labels: &str| value(&metrics, name, labels);
    assert_eq!(get("tollgate_pump_in_flight", "pacer=\"jobs\""), Some(1.0));
    release.notify_one();
    running.await.unwrap().unwrap();

    assert_eq!(get("tollgate_pump_in_flight", "pacer=\"jobs\""), Some(0.0));
    let items = |outcome: &str| get("tollgate_pump_items_total", &format!("pacer=\"jobs\",outcome=\"{outcome}\""));
    assert_eq!(items("done"), Some(3.0), "ok, throttled-once at its second attempt, held");
    assert_eq!(items("throttled"), Some(1.0));
    assert_eq!(items("failed"), Some(1.0));
    assert_eq!(items("dead"), Some(1.0));
    assert_eq!(get("tollgate_pacer_throttled_total", "pacer=\"jobs\""), Some(1.0));
    assert_eq!(get("tollgate_pacer_units_total", "pacer=\"jobs\""), Some(5.0), "4 items, one sent twice");
}
