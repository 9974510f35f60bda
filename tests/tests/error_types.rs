//! The error types services already return, on a real Redis: a gRPC method (`tonic::Status`), an
//! I/O job (`std::io::Result`), an axum handler (`LockError` as the response) and a foreign type
//! through `map_err`, each under contention and with the server down. The attribute's calls go
//! through the global client (`init`), so this file is one test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use http_body_util::BodyExt as _;
use lock_runtime::{LockClient, LockConfig, LockError, distributed_lock};
use lock_tests::{RedisServer, client, unique_key};
use tower::ServiceExt as _;

#[distributed_lock(key = "<key>")]
async fn grpc_method(key: &str) -> Result<tonic::Response<()>, tonic::Status> {
    let _ = key;
    Ok(tonic::Response::new(()))
}

#[distributed_lock(key = "<key>")]
fn io_job(key: &str) -> std::io::Result<()> {
    let _ = key;
    Ok(())
}

#[distributed_lock(key = "<key>")]
async fn handler(Path(key): Path<String>) -> Result<&'static str, LockError> {
    let _ = key;
    Ok("done")
}

/// Stands for a foreign error type: no `From<LockError>`.
#[derive(Debug)]
struct Refused {
    contended: bool,
    message: String,
}

fn refused(err: LockError) -> Refused {
    Refused {
        contended: err.is_contended(),
        message: err.to_string(),
    }
}

#[distributed_lock(key = "<key>", map_err = refused)]
async fn mapped(key: &str) -> Result<(), Refused> {
    let _ = key;
    Ok(())
}

/// `io_job(key)`, a sync locked call, on a thread where it may block.
async fn blocking_io_job(key: &str) -> std::io::Result<()> {
    let key = key.to_owned();
    tokio::task::spawn_blocking(move || io_job(&key))
        .await
        .unwrap()
}

/// The handler's status and body for `key`.
async fn get_job(key: &str) -> (http::StatusCode, String) {
    let app = axum::Router::new().route("/jobs/{key}", get(handler));
    let response = app
        .oneshot(
            http::Request::get(format!("/jobs/{key}"))
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn inner(err: &std::io::Error) -> &LockError {
    err.get_ref()
        .and_then(|e| e.downcast_ref::<LockError>())
        .unwrap_or_else(|| panic!("no LockError inside {err:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_failures_arrive_as_each_services_error_type() {
    let mut server = RedisServer::start();
    lock_runtime::init(
        LockConfig::single(server.url())
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500)),
    )
    .unwrap();
    let other: LockClient = client(LockConfig::single(server.url()));
    let key = unique_key("error-types");

    // Free: each succeeds.
    grpc_method(&key).await.unwrap();
    blocking_io_job(&key).await.unwrap();
    assert_eq!(
        get_job(&key).await,
        (http::StatusCode::OK, "done".to_owned())
    );
    mapped(&key).await.unwrap();

    // Held by someone else: contention, in each type.
    let held = other.lock(&key).acquire().await.unwrap();
    let status = grpc_method(&key).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains(&key), "{status:?}");
    let err = blocking_io_job(&key).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ResourceBusy, "{err:?}");
    assert!(inner(&err).is_contended(), "{err:?}");
    let (code, body) = get_job(&key).await;
    assert_eq!(code, http::StatusCode::CONFLICT, "{body}");
    assert!(body.contains(&key), "{body}");
    let err = mapped(&key).await.unwrap_err();
    assert!(err.contended, "{err:?}");
    held.release().await.unwrap();

    // The server down: unavailable, in each type, never contention.
    server.stop();
    let status = grpc_method(&key).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains(&key), "{status:?}");
    let err = blocking_io_job(&key).await.unwrap_err();
    assert!(
        matches!(inner(&err), LockError::Unavailable { .. }),
        "{err:?}"
    );
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
    let (code, body) = get_job(&key).await;
    assert_eq!(code, http::StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains(&key), "{body}");
    let err = mapped(&key).await.unwrap_err();
    assert!(
        !err.contended && err.message.contains("unavailable"),
        "{err:?}"
    );
    lock_runtime::shutdown();
}
