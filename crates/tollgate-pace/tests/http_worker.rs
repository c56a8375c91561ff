//! The pump's HTTP worker against an in-process API: what it sends, and how it classifies each
//! answer (done, throttled with the Retry-After honoured, failed naming the URL and status).
#![cfg(feature = "http")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::any;
use tollgate_pace::http::{HttpWorker, SendError, parse_line};
use tollgate_pace::{Handled, Item};

/// What the API saw: method, path, idempotency key, content type, body.
type Seen = Arc<Mutex<Vec<(Method, String, String, String, String)>>>;

/// `/ok` answers 200, `/busy` 429 with `Retry-After: 1.5`, `/down` 503, `/boom` 500 with a body.
async fn api() -> (String, Seen) {
    let seen: Seen = Default::default();
    let record = seen.clone();
    let handler = move |method: Method, uri: axum::http::Uri, headers: HeaderMap, body: String| {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let path = uri.path().to_string();
        record.lock().unwrap().push((method, path.clone(), header("idempotency-key"), header("content-type"), body));
        async move {
            match path.as_str() {
                "/ok" => StatusCode::OK.into_response(),
                "/busy" => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1.5")]).into_response(),
                "/down" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "out of widgets").into_response(),
            }
        }
    };
    let app = axum::Router::new().fallback(any(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

fn item(line: &str) -> Item {
    let parsed = parse_line(line, 1).unwrap();
    Item { id: "0-1".into(), key: parsed.key, payload: parsed.payload, cost: parsed.cost, attempts: 0 }
}

#[tokio::test]
async fn each_answer_is_classified_and_the_item_sent_as_written() {
    let (base, seen) = api().await;
    let worker = HttpWorker::new(&format!("{base}/"), Duration::from_secs(5)).unwrap();

    let ok = item(
        r#"{"key":"k1","method":"PUT","path":"/ok","headers":{"content-type":"application/json"},"body":{"n":1}}"#,
    );
    assert!(matches!(worker.send(&ok).await, Handled::Done));
    let (method, path, key, content_type, body) = seen.lock().unwrap()[0].clone();
    assert_eq!((method, path.as_str(), key.as_str()), (Method::PUT, "/ok", "k1"));
    assert_eq!((content_type.as_str(), body.as_str()), ("application/json", r#"{"n":1}"#));

    let text = item(r#"{"path":"/ok","body":"as is"}"#);
    assert!(matches!(worker.send(&text).await, Handled::Done));
    let (method, _, key, _, body) = seen.lock().unwrap()[1].clone();
    assert_eq!((method, body.as_str()), (Method::POST, "as is"), "POST by default, a string body sent as is");
    assert!(key.starts_with("line-1-"), "{key}");

    let busy = worker.send(&item(r#"{"path":"/busy"}"#)).await;
    assert!(matches!(busy, Handled::Throttled(Some(d)) if d == Duration::from_millis(1500)), "{busy:?}");
    let down = worker.send(&item(r#"{"path":"/down"}"#)).await;
    assert!(matches!(down, Handled::Throttled(None)), "{down:?}");

    let Handled::Failed(error) = worker.send(&item(r#"{"path":"/boom"}"#)).await else { panic!("a 500 is a failure") };
    let send = error.downcast_ref::<SendError>().expect("a SendError");
    assert!(matches!(send, SendError::Status { url, status, body }
        if *url == format!("{base}/boom") && *status == StatusCode::INTERNAL_SERVER_ERROR && body == "out of widgets"));
}

#[tokio::test]
async fn a_bad_payload_or_no_server_is_a_failure_not_a_panic() {
    let (base, _) = api().await;
    let worker = HttpWorker::new(&base, Duration::from_secs(5)).unwrap();
    let garbage = Item { id: "0-1".into(), key: "k".into(), payload: "not json".into(), cost: 1, attempts: 0 };
    let Handled::Failed(error) = worker.send(&garbage).await else { panic!("garbage fails") };
    assert!(matches!(error.downcast_ref::<SendError>(), Some(SendError::Item(_))), "{error}");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let nowhere = HttpWorker::new(&format!("http://{closed}"), Duration::from_secs(5)).unwrap();
    let Handled::Failed(error) = nowhere.send(&item(r#"{"path":"/ok"}"#)).await else { panic!("nothing listens") };
    assert!(
        matches!(error.downcast_ref::<SendError>(), Some(SendError::Transport { url, .. }) if url.contains(&closed.to_string()))
    );
}
