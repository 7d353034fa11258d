//! `serve --admin-addr`: the operator's door into a running job, off unless
//! asked for. It binds loopback addresses only and answers loopback peers
//! only. `POST /model` with a trained model directory as the body swaps
//! every node to it (202, or 409 with why it was refused); `GET /model`
//! says what each node of this process serves and the last refusal.
//! `POST /alpha` with a number in [0, 1] pins every node's α there (the
//! allocator's moves are refused meanwhile); with `auto` it releases α to
//! the allocator again.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use grflow_operators::node::NodeCommand;

use crate::models::ModelRegistry;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("--admin-addr {0:?}: not HOST:PORT")]
    Addr(String),
    #[error("--admin-addr {0}: not a loopback address (the admin endpoint is local only)")]
    NotLoopback(String),
    #[error("--admin-addr {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Hands a command to every node of the job (already checked).
pub type Submit = Arc<dyn Fn(NodeCommand) + Send + Sync>;

/// The answer to one admin request: status and JSON body.
#[derive(Debug, PartialEq)]
pub struct AdminReply {
    pub status: u16,
    pub body: serde_json::Value,
}

/// Why commands are no longer applied (the job drains or stops:
/// [`crate::ops::OpsState::refuses_commands`]), or `None`.
pub type Closed<'a> = &'a dyn Fn() -> Option<String>;

/// The answer to a command made once the command source has closed.
fn refused_closed(why: &str) -> AdminReply {
    AdminReply {
        status: 503,
        body: serde_json::json!({
            "error": format!("the job is {why}: commands are no longer applied")
        }),
    }
}

/// Answers `method path` with `body`. `closed` is asked again after a
/// model loads, which may take seconds: the job may have begun draining
/// meanwhile.
pub fn route(
    method: &str,
    path: &str,
    body: &str,
    models: &ModelRegistry,
    submit: &dyn Fn(NodeCommand),
    closed: Closed<'_>,
) -> AdminReply {
    let reply = |status, body| AdminReply { status, body };
    match (method, path.split('?').next().unwrap_or("")) {
        ("POST", "/alpha") => {
            let pin = match body.trim() {
                "auto" => None,
                text => match text.parse::<f64>() {
                    Ok(a) if (0.0..=1.0).contains(&a) => Some(a),
                    _ => {
                        return reply(
                            400,
                            serde_json::json!({
                                "error": format!("the body must be a number in [0, 1] or `auto`, not {text:?}")
                            }),
                        );
                    }
                },
            };
            submit(NodeCommand::PinAlpha(pin));
            tracing::info!(?pin, "alpha pin requested");
            reply(202, serde_json::json!({ "pin": pin }))
        }
        (_, "/alpha") => reply(405, serde_json::json!({"error": "POST /alpha"})),
        ("GET", "/model") => reply(200, models.report()),
        ("POST", "/model") => {
            let dir = body.trim();
            if dir.is_empty() {
                return reply(
                    400,
                    serde_json::json!({"error": "the body must be a model directory path"}),
                );
            }
            // Resolved here: a relative path (or a link moved later) would
            // name another directory, or none, on another process of a
            // cluster, whose working directory differs.
            let resolved = std::fs::canonicalize(dir)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| dir.to_string());
            let dir = resolved.as_str();
            match models.load(dir) {
                Ok(version) => {
                    // The command source closed during the load: the swap
                    // would never be applied, so it is not accepted.
                    if let Some(why) = closed() {
                        tracing::warn!(
                            path = dir,
                            version,
                            "model loaded, but the job is {why}: swap not submitted"
                        );
                        return refused_closed(&why);
                    }
                    submit(NodeCommand::SwapModel {
                        path: dir.into(),
                        version: version.clone(),
                    });
                    tracing::info!(path = dir, version, "model swap requested");
                    reply(
                        202,
                        serde_json::json!({"swapping_to": version, "path": dir}),
                    )
                }
                Err(e) => {
                    tracing::warn!(path = dir, "{e}");
                    reply(409, serde_json::json!({"error": e}))
                }
            }
        }
        (_, "/model") => reply(405, serde_json::json!({"error": "GET or POST /model"})),
        _ => reply(
            404,
            serde_json::json!({"error": "not found: try /model or /alpha"}),
        ),
    }
}

/// The running admin endpoint; stops when dropped.
#[derive(Debug)]
pub struct AdminServer {
    listener: crate::http::Listener,
}

impl AdminServer {
    pub fn start(
        addr: &str,
        models: Arc<ModelRegistry>,
        submit: Submit,
    ) -> Result<Self, AdminError> {
        let parsed = loopback_addr(addr)?;
        let listener = crate::http::Listener::spawn("grflow-admin", parsed, move |stream, peer| {
            answer(stream, peer, &models, &submit)
        })
        .map_err(|source| AdminError::Bind {
            addr: addr.into(),
            source,
        })?;
        tracing::info!(addr = %listener.local_addr(), "admin endpoint (POST /model to swap models)");
        Ok(Self { listener })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// What `start` checks, and that the address can be bound now: for
    /// `serve --check`, and for `serve` before it creates topics or reads
    /// the response topic (the endpoint itself starts later).
    pub fn check_addr(addr: &str) -> Result<(), AdminError> {
        let parsed = loopback_addr(addr)?;
        std::net::TcpListener::bind(parsed)
            .map(drop)
            .map_err(|source| AdminError::Bind {
                addr: addr.into(),
                source,
            })
    }
}

/// A literal loopback `IP:PORT` (the admin endpoint is local only).
fn loopback_addr(addr: &str) -> Result<SocketAddr, AdminError> {
    let parsed: SocketAddr = addr.parse().map_err(|_| AdminError::Addr(addr.into()))?;
    if !parsed.ip().is_loopback() {
        return Err(AdminError::NotLoopback(addr.into()));
    }
    Ok(parsed)
}

/// Bodies larger than this are refused (a path is short).
const MAX_BODY: usize = 64 * 1024;

/// Why a request that changes the job is refused as possibly from a web
/// page: a loopback peer is not enough, since a browser on this host (a
/// page's form or fetch, or a DNS-rebound name) connects from loopback too.
/// Browsers send `Origin` on such requests and the page's name as `Host`;
/// curl and scripts send neither or a loopback `Host`.
fn cross_site(head: &crate::http::Head) -> Option<&'static str> {
    if matches!(head.method.as_str(), "GET" | "HEAD") {
        return None;
    }
    if head.origin.is_some() {
        return Some(
            "refused: a request with an Origin header (a web page) may not change the job",
        );
    }
    match &head.host {
        Some(host) if !is_loopback_host(host) => Some(
            "refused: the Host header must be a loopback name or address \
             (127.0.0.1, localhost, [::1])",
        ),
        _ => None,
    }
}

/// `host` (with or without a port) names this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(ip, _)| ip),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn answer(
    stream: TcpStream,
    peer: SocketAddr,
    models: &ModelRegistry,
    submit: &Submit,
) -> std::io::Result<()> {
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let reply = if !peer.ip().is_loopback() {
        AdminReply {
            status: 403,
            body: serde_json::json!({"error": "the admin endpoint answers loopback peers only"}),
        }
    } else {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        match crate::http::read_head(&stream, deadline) {
            Err(crate::http::HeadError::Io(e)) => return Err(e),
            Err(e) => AdminReply {
                status: 400,
                body: serde_json::json!({"error": e.to_string()}),
            },
            Ok((head, _)) if head.content_length.unwrap_or(0) > MAX_BODY => AdminReply {
                status: 413,
                body: serde_json::json!({"error": "body too large"}),
            },
            Ok((head, mut body_reader)) => match cross_site(&head) {
                Some(why) => AdminReply {
                    status: 403,
                    body: serde_json::json!({ "error": why }),
                },
                None => {
                    let mut body = vec![0u8; head.content_length.unwrap_or(0)];
                    body_reader.read_exact(&mut body)?;
                    // Once draining, the command source has closed: a
                    // command accepted now would never be applied.
                    let refuses = || crate::ops::state().refuses_commands();
                    let closed = (head.method == "POST").then(refuses).flatten();
                    match closed {
                        Some(why) => refused_closed(&why),
                        None => route(
                            &head.method,
                            &head.path,
                            &String::from_utf8_lossy(&body),
                            models,
                            &**submit,
                            &refuses,
                        ),
                    }
                }
            },
        }
    };
    let text = serde_json::to_string(&reply.body).unwrap_or_default() + "\n";
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        reply.status,
        match reply.status {
            200 => "OK",
            202 => "Accepted",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            409 => "Conflict",
            503 => "Service Unavailable",
            _ => "Payload Too Large",
        },
        text.len()
    )?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The job takes commands.
    fn open() -> Option<String> {
        None
    }

    fn registry(accept: bool) -> ModelRegistry {
        ModelRegistry::new(Box::new(move |path| {
            if !accept {
                return Err(format!("{path}: item space differs"));
            }
            Err(format!("{path}: cannot build params in a unit test"))
        }))
    }

    #[test]
    fn a_refused_model_answers_409_and_is_reported() {
        let models = registry(false);
        let submitted = Mutex::new(Vec::new());
        let submit = |c: NodeCommand| submitted.lock().unwrap().push(c);
        let r = route("POST", "/model", "/models/b\n", &models, &submit, &open);
        assert_eq!(r.status, 409);
        assert!(
            r.body["error"]
                .as_str()
                .unwrap()
                .contains("item space differs")
        );
        assert!(submitted.lock().unwrap().is_empty(), "nothing swapped");
        let report = route("GET", "/model", "", &models, &submit, &open);
        assert!(
            report.body["last_error"]
                .as_str()
                .unwrap()
                .contains("/models/b")
        );
        assert_eq!(
            route("POST", "/model", " ", &models, &submit, &open).status,
            400
        );
        assert_eq!(
            route("DELETE", "/model", "", &models, &submit, &open).status,
            405
        );
        assert_eq!(route("GET", "/", "", &models, &submit, &open).status, 404);
    }

    #[test]
    fn a_swap_whose_load_outlasts_the_command_source_answers_503_and_is_not_submitted() {
        use crate::models::test_models::{as_trained, small_params};
        use std::sync::atomic::{AtomicBool, Ordering};
        let base = small_params();
        // The job begins draining while the model loads.
        let draining = Arc::new(AtomicBool::new(false));
        let models = {
            let draining = draining.clone();
            ModelRegistry::new(Box::new(move |_: &str| {
                draining.store(true, Ordering::Relaxed);
                Ok(as_trained(&base, "v2"))
            }))
        };
        let closed = || {
            draining
                .load(Ordering::Relaxed)
                .then(|| "draining".to_string())
        };
        let submitted = Mutex::new(Vec::new());
        let submit = |c: NodeCommand| submitted.lock().unwrap().push(c);
        let r = route("POST", "/model", "/models/v2", &models, &submit, &closed);
        assert_eq!(r.status, 503, "{:?}", r.body);
        assert_eq!(
            r.body["error"],
            "the job is draining: commands are no longer applied"
        );
        assert!(submitted.lock().unwrap().is_empty(), "nothing submitted");
        // A job that still takes commands: accepted and submitted.
        let r = route("POST", "/model", "/models/v2", &models, &submit, &open);
        assert_eq!(r.status, 202, "{:?}", r.body);
        assert_eq!(r.body["swapping_to"], "v2");
        assert_eq!(submitted.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_relative_model_path_is_resolved_before_it_is_loaded() {
        let models = registry(false);
        let submit = |_: NodeCommand| {};
        // The test's working directory exists; "." names it relatively.
        let here = std::fs::canonicalize(".").unwrap().display().to_string();
        let r = route("POST", "/model", ".", &models, &submit, &open);
        assert_eq!(r.status, 409);
        let error = r.body["error"].as_str().unwrap();
        assert!(error.contains(&format!("{here}: item space")), "{error}");
    }

    #[test]
    fn alpha_is_pinned_and_released_by_post() {
        let models = registry(true);
        let submitted = Mutex::new(Vec::new());
        let submit = |c: NodeCommand| submitted.lock().unwrap().push(c);
        assert_eq!(
            route("POST", "/alpha", "0.3\n", &models, &submit, &open).status,
            202
        );
        assert_eq!(
            route("POST", "/alpha", "auto", &models, &submit, &open).status,
            202
        );
        assert_eq!(
            route("POST", "/alpha", "1.5", &models, &submit, &open).status,
            400
        );
        assert_eq!(
            route("POST", "/alpha", "lots", &models, &submit, &open).status,
            400
        );
        assert_eq!(
            route("GET", "/alpha", "", &models, &submit, &open).status,
            405
        );
        assert_eq!(
            *submitted.lock().unwrap(),
            vec![
                NodeCommand::PinAlpha(Some(0.3)),
                NodeCommand::PinAlpha(None)
            ]
        );
    }

    #[test]
    fn only_loopback_addresses_are_bound() {
        let models = Arc::new(registry(true));
        let err = AdminServer::start("0.0.0.0:0", models.clone(), Arc::new(|_| {})).unwrap_err();
        assert!(matches!(err, AdminError::NotLoopback(_)), "{err}");
        let server = AdminServer::start("127.0.0.1:0", models, Arc::new(|_| {})).unwrap();
        assert!(server.local_addr().ip().is_loopback());
    }

    /// POST /alpha with `headers`: (status, commands submitted).
    fn post_alpha(headers: &str) -> (u16, usize) {
        use std::io::{Read, Write};
        let submitted = Arc::new(Mutex::new(0usize));
        let count = submitted.clone();
        let submit: Submit = Arc::new(move |_| *count.lock().unwrap() += 1);
        let server = AdminServer::start("127.0.0.1:0", Arc::new(registry(true)), submit).unwrap();
        let mut conn = TcpStream::connect(server.local_addr()).unwrap();
        let body = "0.5";
        write!(
            conn,
            "POST /alpha HTTP/1.1\r\n{headers}Content-Type: text/plain\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        conn.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        let n = *submitted.lock().unwrap();
        (status, n)
    }

    #[test]
    fn a_web_page_cannot_change_the_job_through_a_loopback_browser() {
        // A page's no-cors POST carries its Origin; a DNS-rebound name its
        // own Host. Both were accepted (202) and α was pinned.
        let page = post_alpha("Host: 127.0.0.1:1\r\nOrigin: http://evil.example\r\n");
        assert_eq!(page, (403, 0));
        let rebound = post_alpha("Host: evil.example:19465\r\n");
        assert_eq!(rebound, (403, 0));
        // curl and scripts: a loopback Host, or none.
        for host in [
            "Host: 127.0.0.1:9\r\n",
            "Host: localhost:9\r\n",
            "Host: [::1]:9\r\n",
            "",
        ] {
            assert_eq!(post_alpha(host), (202, 1), "{host:?}");
        }
    }
}
