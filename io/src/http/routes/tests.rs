//! Tests of the routing decisions.

use super::*;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn upgrade(path: &str) -> hyper::http::request::Builder {
    Request::get(path)
        .header("Host", "x")
        .header("Upgrade", "websocket")
        .header("Connection", "Upgrade")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", KEY)
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tag {
    Link,
    Env,
    Connect,
}

fn relay_routes(capacity: Option<Arc<Semaphore>>) -> Routes<Tag> {
    Routes {
        health: Health::always(),
        metrics: None,
        not_found_hint: None,
        upgrades: vec![
            UpgradeRoute {
                path: PathPattern::Exact("/v1/link"),
                route: Tag::Link,
                capacity,
            },
            UpgradeRoute {
                path: PathPattern::WithId("/v1/env/"),
                route: Tag::Env,
                capacity: None,
            },
            UpgradeRoute {
                path: PathPattern::WithId("/v1/connect/"),
                route: Tag::Connect,
                capacity: None,
            },
        ],
    }
}

fn reply_of<R>(d: Decision<R>) -> Reply {
    match d {
        Decision::Reply(r) => r,
        Decision::Upgrade(_) => panic!("expected a reply, got an upgrade"),
    }
}

fn upgrade_of<R>(d: Decision<R>) -> Accepted<R> {
    match d {
        Decision::Upgrade(a) => a,
        Decision::Reply(r) => panic!("expected an upgrade, got {r:?}"),
    }
}

#[test]
fn paths_route_to_their_upgrade_with_the_captured_id() {
    let routes = relay_routes(None);
    let a = upgrade_of(decide(&routes, &upgrade("/v1/link").body(()).unwrap()));
    assert_eq!((a.route, a.id), (Tag::Link, None));
    // RFC 6455 §1.3's example key and accept value.
    assert_eq!(a.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    let a = upgrade_of(decide(
        &routes,
        &upgrade("/v1/env/e-1.x_y~z").body(()).unwrap(),
    ));
    assert_eq!((a.route, a.id.as_deref()), (Tag::Env, Some("e-1.x_y~z")));
    let a = upgrade_of(decide(
        &routes,
        &upgrade("/v1/connect/c9?x=1").body(()).unwrap(),
    ));
    assert_eq!((a.route, a.id.as_deref()), (Tag::Connect, Some("c9")));
    for path in [
        "/",
        "/v1/link/",
        "/v1/env/",
        "/v1/env/a/b",
        "/v1/env/%2e",
        "/v1/connectx/a",
    ] {
        let d = decide(&routes, &upgrade(path).body(()).unwrap());
        assert_eq!(reply_of(d), Reply::NotFound, "{path}");
    }
    let at_cap = format!("/v1/env/{}", "i".repeat(MAX_ROUTE_ID_BYTES));
    assert!(
        upgrade_of(decide(&routes, &upgrade(&at_cap).body(()).unwrap()))
            .id
            .is_some()
    );
    let over = format!("/v1/env/{}", "i".repeat(MAX_ROUTE_ID_BYTES + 1));
    let d = decide(&routes, &upgrade(&over).body(()).unwrap());
    assert_eq!(reply_of(d), Reply::NotFound);
}

#[test]
fn any_upgrade_with_an_origin_is_forbidden_first() {
    let routes = relay_routes(None);
    let r = upgrade("/v1/link")
        .header("Origin", "null")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &r)), Reply::Forbidden);
    // Even on a path that would be 404, and with only the key (no Upgrade field).
    let r = Request::get("/nowhere")
        .header("Sec-WebSocket-Key", KEY)
        .header("Origin", "https://evil.example")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &r)), Reply::Forbidden);
    let r = Request::get("/readyz")
        .header("Upgrade", "h2c")
        .header("Origin", "x")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &r)), Reply::Forbidden);
    // A plain request with an Origin is not an upgrade: readyz answers.
    let r = Request::get("/readyz?probe=1")
        .header("Origin", "x")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &r)), Reply::Ready);
}

#[test]
fn plain_requests() {
    let routes = relay_routes(None);
    let get = |p: &str| Request::get(p).body(()).unwrap();
    assert_eq!(reply_of(decide(&routes, &get("/readyz"))), Reply::Ready);
    let post = Request::post("/readyz").body(()).unwrap();
    assert_eq!(reply_of(decide(&routes, &post)), Reply::MethodNotAllowed);
    assert_eq!(
        reply_of(decide(&routes, &get("/readyz/x"))),
        Reply::NotFound
    );
    assert_eq!(reply_of(decide(&routes, &get("/metrics"))), Reply::NotFound);
    // An upgrade to something else than WebSocket is a plain request.
    let h2c = Request::get("/readyz")
        .header("Upgrade", "h2c")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &h2c)), Reply::Ready);

    let metrics: Routes<Tag> = Routes {
        health: None,
        metrics: Some(Arc::new(|| "# EOF\n".to_owned())),
        not_found_hint: None,
        upgrades: Vec::new(),
    };
    assert_eq!(
        reply_of(decide(&metrics, &get("/metrics?x=1"))),
        Reply::Metrics("# EOF\n".into())
    );
    let post = Request::post("/metrics").body(()).unwrap();
    assert_eq!(reply_of(decide(&metrics, &post)), Reply::MethodNotAllowed);
    assert_eq!(reply_of(decide(&metrics, &get("/readyz"))), Reply::NotFound);
    assert_eq!(
        reply_of(decide(&metrics, &upgrade("/metrics").body(()).unwrap())),
        Reply::NotFound
    );
}

#[test]
fn health_routes_follow_the_callers_check() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let up = Arc::new(AtomicBool::new(false));
    let check = up.clone();
    let routes: Routes<Tag> = Routes {
        health: Some(Health {
            ready: Some(Arc::new(move || {
                if check.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("environment link connecting".into())
                }
            })),
            status: Some(Arc::new(|| "{\"ok\":true}".to_owned())),
        }),
        metrics: None,
        not_found_hint: None,
        upgrades: Vec::new(),
    };
    let get = |p: &str| Request::get(p).body(()).unwrap();
    let reply = reply_of(decide(&routes, &get("/readyz")));
    assert_eq!(reply, Reply::NotReady("environment link connecting".into()));
    let response = reply.into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "5");
    // Liveness does not depend on readiness.
    assert_eq!(reply_of(decide(&routes, &get("/livez"))), Reply::Ready);
    up.store(true, Ordering::SeqCst);
    assert_eq!(reply_of(decide(&routes, &get("/readyz"))), Reply::Ready);
    let status = reply_of(decide(&routes, &get("/status")));
    assert_eq!(status, Reply::Status("{\"ok\":true}".into()));
    assert_eq!(status.into_response().headers()[header::CONTENT_TYPE], JSON);
    for path in ["/readyz", "/livez", "/status"] {
        let post = Request::post(path).body(()).unwrap();
        assert_eq!(
            reply_of(decide(&routes, &post)),
            Reply::MethodNotAllowed,
            "{path}"
        );
    }
    // Without a status renderer, /status is not served; without health, nothing is.
    let plain: Routes<Tag> = Routes {
        health: Health::always(),
        metrics: None,
        not_found_hint: None,
        upgrades: Vec::new(),
    };
    assert_eq!(reply_of(decide(&plain, &get("/status"))), Reply::NotFound);
    assert_eq!(reply_of(decide(&plain, &get("/readyz"))), Reply::Ready);
    let none: Routes<Tag> = Routes {
        health: None,
        metrics: None,
        not_found_hint: None,
        upgrades: Vec::new(),
    };
    for path in ["/readyz", "/livez", "/status"] {
        assert_eq!(
            reply_of(decide(&none, &get(path))),
            Reply::NotFound,
            "{path}"
        );
    }
}

#[test]
fn websocket_handshakes_are_checked() {
    let routes = relay_routes(None);
    let r = upgrade("/v1/link")
        .header("Upgrade", "h2c, WebSocket")
        .body(())
        .unwrap();
    assert!(matches!(decide(&routes, &r), Decision::Upgrade(_)));
    let no_connection = Request::get("/v1/link")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", KEY)
        .body(())
        .unwrap();
    assert!(matches!(
        reply_of(decide(&routes, &no_connection)),
        Reply::BadRequest(_)
    ));
    let old = upgrade("/v1/link")
        .header("Sec-WebSocket-Version", "8")
        .body(())
        .unwrap();
    // `header` appends: both values are present; replace instead.
    let mut old = old;
    old.headers_mut()
        .insert("sec-websocket-version", HeaderValue::from_static("8"));
    assert_eq!(reply_of(decide(&routes, &old)), Reply::UpgradeRequired);
    let mut bad_key = upgrade("/v1/link").body(()).unwrap();
    bad_key
        .headers_mut()
        .insert("sec-websocket-key", HeaderValue::from_static("short"));
    assert!(matches!(
        reply_of(decide(&routes, &bad_key)),
        Reply::BadRequest(_)
    ));
    // Two keys: which would be answered? Refused (RFC 6455 §11.3.1).
    let two_keys = upgrade("/v1/link")
        .header("Sec-WebSocket-Key", "AAAAAAAAAAAAAAAAAAAAAA==")
        .body(())
        .unwrap();
    assert_eq!(
        reply_of(decide(&routes, &two_keys)),
        Reply::BadRequest("a WebSocket upgrade needs exactly one Sec-WebSocket-Key")
    );
    // A body on the handshake (the request-smuggling shapes): refused; `Content-Length: 0`
    // is no body and passes.
    let no_body =
        "a WebSocket upgrade carries no body (no Transfer-Encoding, no Content-Length but 0)";
    for (name, value) in [
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "5"),
        ("Content-Length", " 1"),
    ] {
        let r = upgrade("/v1/link").header(name, value).body(()).unwrap();
        assert_eq!(
            reply_of(decide(&routes, &r)),
            Reply::BadRequest(no_body),
            "{name}: {value}"
        );
    }
    let both = upgrade("/v1/link")
        .header("Content-Length", "0")
        .header("Transfer-Encoding", "chunked")
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &both)), Reply::BadRequest(no_body));
    let twice = upgrade("/v1/link")
        .header("Content-Length", "0")
        .header("Content-Length", "0")
        .body(())
        .unwrap();
    assert_eq!(
        reply_of(decide(&routes, &twice)),
        Reply::BadRequest(no_body)
    );
    let empty = upgrade("/v1/link")
        .header("Content-Length", "0")
        .body(())
        .unwrap();
    assert!(matches!(decide(&routes, &empty), Decision::Upgrade(_)));
    let post = Request::post("/v1/link")
        .header("Upgrade", "websocket")
        .header("Connection", "Upgrade")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", KEY)
        .body(())
        .unwrap();
    assert_eq!(reply_of(decide(&routes, &post)), Reply::MethodNotAllowed);
}

#[test]
fn a_full_route_answers_busy_and_a_freed_slot_lets_the_next_in() {
    let slots = Arc::new(Semaphore::new(1));
    let routes = relay_routes(Some(slots.clone()));
    let first = upgrade_of(decide(&routes, &upgrade("/v1/link").body(()).unwrap()));
    assert_eq!(slots.available_permits(), 0);
    let d = decide(&routes, &upgrade("/v1/link").body(()).unwrap());
    assert_eq!(reply_of(d), Reply::Busy);
    // Other routes are not capped by it.
    assert!(matches!(
        decide(&routes, &upgrade("/v1/env/a").body(()).unwrap()),
        Decision::Upgrade(_)
    ));
    drop(first);
    assert!(matches!(
        decide(&routes, &upgrade("/v1/link").body(()).unwrap()),
        Decision::Upgrade(_)
    ));
}

#[test]
fn replies_carry_their_status_and_headers() {
    let r = Reply::MethodNotAllowed.into_response();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers()[header::ALLOW], "GET");
    let r = Reply::UpgradeRequired.into_response();
    assert_eq!(r.headers()[header::SEC_WEBSOCKET_VERSION], "13");
    assert_eq!(r.headers()[header::CONNECTION], "close");
    let r = Reply::Busy.into_response();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = Reply::Metrics(String::new()).into_response();
    assert_eq!(r.headers()[header::CONTENT_TYPE], METRICS_CONTENT_TYPE);
}

/// An upgrade on a path the listener does not serve gets its hint as the body of the
/// `404` (a client dialled the wrong URL form); other requests keep the plain `404`.
#[test]
fn an_upgrade_elsewhere_is_told_what_this_listener_is() {
    let mut routes = relay_routes(None);
    routes.not_found_hint = Some("this is a relay");
    let d = decide(&routes, &upgrade("/").body(()).unwrap());
    let reply = reply_of(d);
    assert_eq!(reply, Reply::NotServedHere("this is a relay"));
    assert_eq!(reply.status(), StatusCode::NOT_FOUND);
    let get = Request::get("/nothing").body(()).unwrap();
    assert_eq!(reply_of(decide(&routes, &get)), Reply::NotFound);
}

#[test]
fn every_valid_environment_id_is_a_route_id_and_no_other() {
    use execrelay_protocol::keys::environments::valid_environment_id;
    let pattern = PathPattern::WithId("/v1/env/");
    let longest = "i".repeat(MAX_ROUTE_ID_BYTES);
    for good in ["a", "A-z_0.9~", longest.as_str()] {
        assert!(valid_environment_id(good), "{good}");
        assert!(
            pattern.matches(&format!("/v1/env/{good}")).is_some(),
            "{good}"
        );
    }
    let too_long = "i".repeat(MAX_ROUTE_ID_BYTES + 1);
    for bad in ["a/b", "a%20", too_long.as_str()] {
        assert!(!valid_environment_id(bad), "{bad}");
        assert!(
            pattern.matches(&format!("/v1/env/{bad}")).is_none(),
            "{bad}"
        );
    }
}
