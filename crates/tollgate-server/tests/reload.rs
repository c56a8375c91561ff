//! Hot reload: a valid change is applied keeping unchanged limits' counters, an invalid file is
//! kept out (the last good limits stay), an atomic rename is noticed.

mod support;

use std::time::{Duration, Instant};

use support::{generation, server};
use tollgate_server::serve::{Mode, Reloaded};

const V1: &str = "- {namespace: ns, name: kept, max_value: 5, seconds: 60}\n\
                  - {namespace: ns, name: dropped, max_value: 9, seconds: 60, conditions: [\"a == 'b'\"]}\n";
const V2: &str = "- {namespace: ns, name: kept, max_value: 5, seconds: 60}\n\
                  - {namespace: ns, name: new, max_value: 1, seconds: 60, conditions: [\"a == 'c'\"]}\n";

fn body(a: &str) -> String {
    format!(r#"{{"namespace":"ns","values":{{"a":"{a}"}},"delta":1}}"#)
}

async fn remaining(server: &support::Server, name: &str) -> Option<u64> {
    let counters: serde_json::Value = serde_json::from_str(&server.get("/counters/ns").await.1).unwrap();
    counters.as_array().unwrap().iter().find(|c| c["limit"]["name"] == name).and_then(|c| c["remaining"].as_u64())
}

#[tokio::test]
async fn valid_change_keeps_unchanged_counters() {
    let server = server(V1, Mode::Accuracy, false, false).await;
    for _ in 0..2 {
        assert_eq!(server.post("/check_and_report", &body("b")).await.0, 200);
    }
    assert_eq!(remaining(&server, "kept").await, Some(3));
    std::fs::write(&server.limits, V2).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Applied(2));
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Unchanged, "same content, nothing to do");
    assert_eq!(remaining(&server, "kept").await, Some(3), "the unchanged limit kept its counter");
    assert_eq!(remaining(&server, "dropped").await, None);
    assert_eq!(server.post("/check_and_report", &body("c")).await.0, 200);
    assert_eq!(server.post("/check_and_report", &body("c")).await.0, 429, "the new limit is in force");

    // Only max_value changes: same counter, new limit.
    std::fs::write(&server.limits, V2.replace("max_value: 5", "max_value: 4")).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Applied(3));
    assert_eq!(remaining(&server, "kept").await, Some(1), "3 hits counted (the limited one took nothing), of 4");
}

#[tokio::test]
async fn invalid_file_is_kept_out() {
    let server = server(V1, Mode::Accuracy, false, false).await;
    std::fs::write(&server.limits, "- {namespace: ns, max_value: -1, seconds: 60}\n").unwrap();
    let error = server.running.reloader.reload().unwrap_err();
    assert!(
        error.to_string().ends_with("limits.yaml:1:30: max_value must be from 0 to 18446744073709551615, got -1"),
        "{error}"
    );
    assert_eq!(server.running.engine.loaded().generation, 1);
    assert_eq!(server.post("/check_and_report", &body("b")).await.0, 200, "still serving the last good limits");
    let metrics = server.get("/metrics").await.1;
    assert!(metrics.contains("tollgate_config_reload_errors_total 1"), "{metrics}");
    assert!(metrics.contains("tollgate_config_last_reload_failed{error=\""), "{metrics}");
    let status: serde_json::Value = serde_json::from_str(&server.get("/status").await.1).unwrap();
    assert_eq!(status["config_err_since"], 1);

    std::fs::write(&server.limits, V2).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Applied(2));
    assert!(server.get("/metrics").await.1.contains("tollgate_config_last_reload_failed 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_notices_writes_and_atomic_renames() {
    let server = server(V1, Mode::Accuracy, false, true).await;
    std::fs::write(&server.limits, V2).unwrap();
    assert_eq!(generation(&server, 2).await, 2, "an in-place write is noticed");

    // What editors and `kubectl` do: write elsewhere, rename over the file.
    let staged = server.limits.with_file_name(".limits.yaml.tmp");
    std::fs::write(&staged, V1).unwrap();
    std::fs::rename(&staged, &server.limits).unwrap();
    assert_eq!(generation(&server, 3).await, 3, "an atomic rename is noticed");
    assert!(server.running.engine.loaded().policy.limits().iter().any(|l| l.name() == Some("dropped")));

    // Kubernetes' ConfigMap layout: limits.yaml -> ..data/limits.yaml, ..data -> a versioned dir.
    let dir = server.limits.parent().unwrap();
    let v1 = dir.join("..v1");
    let v2 = dir.join("..v2");
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v1.join("limits.yaml"), V1).unwrap();
    std::fs::write(v2.join("limits.yaml"), V2.replace("max_value: 1,", "max_value: 7,")).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::fs::remove_file(&server.limits).unwrap();
    std::os::unix::fs::symlink("..data/limits.yaml", &server.limits).unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    let reached = generation(&server, 4).await;
    assert!(reached >= 4, "the symlink swap is noticed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.running.engine.loaded().policy.limits().iter().any(|l| l.max_value() == 7) {
        assert!(Instant::now() < deadline, "the swapped-in content is loaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `tollgate_config_reload_errors_total` and `/status`'s `config_err_since`.
async fn reload_errors(server: &support::Server) -> (u64, u64) {
    let metrics = server.get("/metrics").await.1;
    let total = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_config_reload_errors_total "))
        .and_then(|v| v.trim().parse().ok())
        .expect("tollgate_config_reload_errors_total is exported");
    let status: serde_json::Value = serde_json::from_str(&server.get("/status").await.1).unwrap();
    (total, status["config_err_since"].as_u64().unwrap())
}

const BAD_A: &str = "- {namespace: ns, max_value: -1, seconds: 60}\n";
const BAD_B: &str = "- {namespace: ns, max_value: 5, seconds: 60, colour: red}\n";

#[tokio::test]
async fn a_bad_version_is_counted_once_however_often_it_is_read() {
    let server = server(V1, Mode::Accuracy, false, false).await;
    std::fs::write(&server.limits, BAD_A).unwrap();
    let first = server.running.reloader.reload().unwrap_err();
    for _ in 0..20 {
        assert_eq!(server.running.reloader.reload().unwrap_err(), first, "the same file, the same error");
    }
    assert_eq!(reload_errors(&server).await, (1, 1), "one bad version, read 21 times");

    std::fs::write(&server.limits, BAD_B).unwrap();
    for _ in 0..5 {
        assert!(server.running.reloader.reload().unwrap_err().to_string().contains("colour"));
    }
    assert_eq!(reload_errors(&server).await, (2, 2), "a second, different bad version");

    // The first bad version again is a new rejection: the file changed to it.
    std::fs::write(&server.limits, BAD_A).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap_err(), first);
    assert_eq!(reload_errors(&server).await, (3, 3));
    assert_eq!(server.running.engine.loaded().generation, 1, "nothing bad was applied");
}

#[tokio::test]
async fn reverting_a_bad_edit_clears_the_failure() {
    let server = server(V1, Mode::Accuracy, false, false).await;
    std::fs::write(&server.limits, BAD_A).unwrap();
    server.running.reloader.reload().unwrap_err();
    assert!(server.get("/metrics").await.1.contains("tollgate_config_last_reload_failed{error="));

    // Back to the content in force: nothing to apply, and nothing failing any more.
    std::fs::write(&server.limits, V1).unwrap();
    assert_eq!(server.running.reloader.reload().unwrap(), Reloaded::Unchanged);
    assert!(server.get("/metrics").await.1.contains("tollgate_config_last_reload_failed 0"));
    assert_eq!(reload_errors(&server).await, (1, 0), "the total stays; failures since the last good reset");
    assert_eq!(server.running.engine.loaded().generation, 1);
}

/// The watcher used to hear its own reads (an open is an inotify event): a bad file left in
/// place was re-read, logged and counted about 20 times a second. Left for a second now, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_counts_a_bad_file_left_in_place_once() {
    let server = server(V1, Mode::Accuracy, false, true).await;
    std::fs::write(&server.limits, BAD_A).unwrap();
    // Paces the fault (the file stays bad this long); no limiter logic waits on it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(reload_errors(&server).await, (1, 1), "one bad version in place for 1 s");

    std::fs::write(&server.limits, BAD_B).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(reload_errors(&server).await, (2, 2), "a second bad version");

    std::fs::write(&server.limits, V2).unwrap();
    assert_eq!(generation(&server, 2).await, 2, "a good version is applied");
    assert_eq!(reload_errors(&server).await, (2, 0));
}
