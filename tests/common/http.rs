//! Plain HTTP/1.1 against a running job's endpoints (metrics, health,
//! readiness, admin) and sums over Prometheus text, for the tests that
//! scrape one.

#![allow(dead_code)] // each test binary uses a different part

use std::io::{Read, Write};
use std::net::TcpStream;

/// A loopback port free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A loopback address with a port free now.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// (status, body) of `method path` with `body`, or None while nothing
/// listens (or the answer is cut short).
pub fn request(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Some((status, body))
}

/// (status, body) of GET `path`, or None while nothing listens.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    request(addr, "GET", path, "")
}

/// Sum of every sample of `name` (over its labels) in Prometheus text.
pub fn metric_total(metrics: &str, name: &str) -> f64 {
    metric_total_where(metrics, name, "")
}

/// Sum of the samples of `name` whose line contains `label` ("" for all).
pub fn metric_total_where(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Polls `addr` until something accepts a connection; false if nothing
/// did within `within`.
pub fn wait_listening(addr: &str, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while TcpStream::connect(addr).is_err() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}
