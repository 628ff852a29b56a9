//! The relay's one serving loop, [`RelayServer::run`]: joining the cluster, the accept loop
//! (TLS when configured, each connection handed to a link runtime), the watchers of the
//! environments file and of the certificate files, the metrics listener, and the shutdown
//! sequence. It never reads a frame: upgrades become links in `links.rs`, frames go to the hub.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    links, lock, unix_micros, MetricsHandle, RelayServer, Route, CONNECT_PATH_PREFIX,
    ENV_PATH_PREFIX, RELAY_HINT, SHUTDOWN_TIMEOUT,
};
use crate::cluster::node::{ClusterNode, NodeLimits};
use crate::cluster::relay_link::RELAY_PATH_PREFIX;
use execrelay_io::driver::link_websocket_config_with;
use execrelay_io::http::{
    self, Front, Health, MetricsRenderer, OnUpgrade, PathPattern, Routes, Upgrade, UpgradeRoute,
};
use execrelay_io::tls::CERTIFICATE_POLL_MS;
use execrelay_protocol::replay::ReplayCache;

impl RelayServer {
    /// Serve relay links on `listener` (and metrics on `metrics`, if given) until `shutdown`
    /// fires; then, once: stop accepting, close every link (each sends a close frame, bounded),
    /// and wait for their tasks (at most [`SHUTDOWN_TIMEOUT`]).
    pub async fn run(
        self,
        listener: TcpListener,
        metrics: Option<TcpListener>,
        shutdown: CancellationToken,
    ) {
        let RelayServer {
            hub,
            shared,
            tls,
            cluster,
            runtimes,
        } = self;
        let settings = &shared.settings;
        if let Some(spec) = cluster {
            let limits = NodeLimits {
                lookup_timeout: Duration::from_millis(settings.cluster_lookup_timeout_ms),
                max_lookups: settings.max_cluster_lookups,
                lookups_per_second: settings.cluster_lookups_per_second,
                max_relay_links: settings.max_relay_links,
                dial_timeout: settings.link_handshake_timeout(),
                max_frame_bytes: settings.max_frame_bytes,
                moves_per_second: settings.moves_per_second,
                move_min_link_age: Duration::from_millis(settings.move_min_link_age_ms),
            };
            let stamps = ReplayCache::new(settings.replay_limits(), unix_micros());
            let (node, url) = (spec.node_id.clone(), spec.nats_url.clone());
            match ClusterNode::start(spec, limits, stamps, hub.clone()).await {
                Ok(n) => {
                    tracing::info!(%node, nats = %url, "cluster: joined (directory connecting in the background)");
                    if settings.trusted_front.is_empty() {
                        tracing::warn!(
                            %node,
                            "cluster: trusted_front is empty, so no peer's X-Execrelay-Front header is honoured and environments never move home after a membership change: give the front's (HAProxy's) address with --trusted-front ADDR"
                        );
                    } else {
                        tracing::info!(%node, trusted_front = %settings.trusted_front, "cluster: the front's header is honoured from these addresses only");
                    }
                    let _ = shared.cluster.set(n);
                }
                Err(e) => {
                    tracing::error!(%node, nats = %url, error = %e, "cluster: cannot use the directory; serving standalone")
                }
            }
        }
        let stop_accepting = CancellationToken::new();
        let fronts = TaskTracker::new();
        let tasks = TaskTracker::new();
        let client_links = Arc::new(Semaphore::new(settings.max_client_links));

        // Ready while the relay accepts links: once shutdown begins, every listener stops, and
        // nothing else makes a relay unable to serve (a broken environments file keeps the
        // links up and is its own metric and alert).
        // What `/metrics` and `/status` read, for the closures that serve them.
        let view = MetricsHandle {
            hub: hub.clone(),
            shared: shared.clone(),
            tls: tls.clone(),
            runtimes: runtimes.clone(),
        };
        let health = {
            let view = view.clone();
            let stopping = shutdown.clone();
            Health {
                ready: Some(Arc::new(move || {
                    if stopping.is_cancelled() {
                        Err("shutting down".into())
                    } else {
                        Ok(())
                    }
                })),
                status: Some(Arc::new(move || view.status())),
            }
        };
        let routes = Routes {
            health: Some(health.clone()),
            metrics: None,
            not_found_hint: Some(RELAY_HINT),
            upgrades: vec![
                UpgradeRoute {
                    path: PathPattern::WithId(ENV_PATH_PREFIX),
                    route: Route::Environment,
                    capacity: None,
                },
                UpgradeRoute {
                    path: PathPattern::WithId(CONNECT_PATH_PREFIX),
                    route: Route::Client,
                    capacity: Some(client_links),
                },
            ]
            .into_iter()
            .chain(shared.cluster().map(|_| UpgradeRoute {
                path: PathPattern::WithId(RELAY_PATH_PREFIX),
                route: Route::Relay,
                capacity: None,
            }))
            .collect(),
        };
        let on_upgrade: OnUpgrade<Route> = {
            let (hub, shared, tasks, stop) =
                (hub.clone(), shared.clone(), tasks.clone(), shutdown.clone());
            Arc::new(move |up: Upgrade<Route>| {
                let Some(id) = up.id.clone() else {
                    return;
                };
                let (hub, shared, stop) = (hub.clone(), shared.clone(), stop.clone());
                match up.route {
                    Route::Environment => {
                        tasks.spawn(links::environment_link(
                            hub, shared, up.ws, id, up.peer, stop,
                        ));
                    }
                    Route::Relay => {
                        tasks.spawn(links::relay_link(hub, shared, up.ws, id, up.peer, stop));
                    }
                    Route::Client => {
                        let permit = up.permit;
                        let via_front = up.via_front;
                        tasks.spawn(async move {
                            links::client_link(hub, shared, up.ws, id, up.peer, via_front, stop)
                                .await;
                            // The slot of `max_client_links` is free once the link ends.
                            drop(permit);
                        });
                    }
                }
            })
        };
        let front = Front {
            routes,
            limits: settings.front_limits(),
            websocket: link_websocket_config_with(settings.max_frame_bytes),
            on_upgrade,
            tls: tls.clone(),
        };
        match runtimes.clone() {
            Some(runtimes) => {
                let homes = shared.clone();
                let home: http::HomeOf<Route> = Arc::new(move |route, id| match (route, id) {
                    (Route::Client, Some(id)) => lock(&homes.homes).get(id).map(|h| h.1),
                    _ => None,
                });
                let spread = http::Spread {
                    runtimes,
                    home: Some(home),
                };
                fronts.spawn(http::serve_spread(
                    listener,
                    front,
                    spread,
                    stop_accepting.clone(),
                ))
            }
            None => fronts.spawn(http::serve(listener, front, stop_accepting.clone())),
        };
        if let Some(tls) = &tls {
            tasks.spawn(
                tls.clone()
                    .watch(Duration::from_millis(CERTIFICATE_POLL_MS), shutdown.clone()),
            );
        }

        if let Some(listener) = metrics {
            let view = view.clone();
            let renderer: MetricsRenderer = Arc::new(move || view.render());
            let front: Front<Route> = Front {
                routes: Routes {
                    health: Some(health),
                    metrics: Some(renderer),
                    upgrades: Vec::new(),
                    not_found_hint: None,
                },
                limits: settings.metrics_front_limits(),
                websocket: link_websocket_config_with(settings.max_frame_bytes),
                on_upgrade: Arc::new(|_| {}),
                tls: None,
            };
            fronts.spawn(http::serve(listener, front, stop_accepting.clone()));
        }

        tasks.spawn(links::watch_environments(
            hub.clone(),
            shared.clone(),
            shutdown.clone(),
        ));

        shutdown.cancelled().await;
        tracing::info!("shutting down: closing every link");
        stop_accepting.cancel();
        fronts.close();
        fronts.wait().await;
        hub.shutdown();
        tasks.close();
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("links still closing after the shutdown timeout; leaving them");
        }
        if let Some(c) = shared.cluster() {
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, c.leave()).await;
        }
    }
}
