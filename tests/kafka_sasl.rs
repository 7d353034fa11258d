//! Kafka with SASL/PLAIN against a real broker. tansu 0.6 has no SASL, so
//! the test puts a proxy of its own in front of a tansu of its own that
//! advertises the proxy's port. The proxy does the broker's part of the
//! SASL exchange (Kafka's SaslHandshake and SaslAuthenticate requests,
//! added to tansu's ApiVersions answer) and checks the user and password,
//! then relays the connection. `grflow serve` and `grflow send` with
//! `security.protocol = "sasl_plaintext"` and the password from
//! GRFLOW_KAFKA_SASL_PASSWORD (not the config file) answer every request;
//! a wrong password is refused. Skipped with a reason without tansu on PATH.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use common::http::free_port;
use common::own_broker::{
    Broker, config_creating_topics, refused_send, serve_and_send_all, tansu_available,
};
use common::temp::tmp_dir;

const USER: &str = "grflow";
const PASSWORD: &str = "s3cret";

const API_VERSIONS: i16 = 18;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
/// Kafka's SASL_AUTHENTICATION_FAILED.
const AUTHENTICATION_FAILED: i16 = 58;

fn read_frame(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut frame = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut frame)?;
    Ok(frame)
}

fn write_frame(s: &mut impl Write, frame: &[u8]) -> std::io::Result<()> {
    s.write_all(&(frame.len() as i32).to_be_bytes())?;
    s.write_all(frame)
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

/// An unsigned varint at `at`: (value, bytes read).
fn uvarint(b: &[u8], at: usize) -> (u64, usize) {
    let (mut v, mut shift, mut n) = (0u64, 0, 0);
    loop {
        let byte = b[at + n];
        v |= u64::from(byte & 0x7f) << shift;
        n += 1;
        if byte & 0x80 == 0 {
            return (v, n);
        }
        shift += 7;
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// tansu's ApiVersions answer (`version` of the request) with SaslHandshake
/// v1 and SaslAuthenticate v0–1 added, so that the client authenticates.
fn with_sasl_apis(resp: &[u8], version: i16) -> Vec<u8> {
    // correlation id (4), error code (2), then the api key array.
    if i16_at(resp, 4) != 0 {
        return resp.to_vec();
    }
    // From v3 the array is compact (a varint count + 1) and each entry
    // (api key, min, max) ends in tagged fields.
    let flexible = version >= 3;
    let (n, mut at) = if flexible {
        let (n, len) = uvarint(resp, 6);
        (n.saturating_sub(1) as usize, 6 + len)
    } else {
        (
            i32::from_be_bytes(resp[6..10].try_into().unwrap()) as usize,
            10,
        )
    };
    let mut kept = Vec::new();
    for _ in 0..n {
        let start = at;
        at += 6;
        if flexible {
            let (tags, l) = uvarint(resp, at);
            at += l;
            for _ in 0..tags {
                let (_, l1) = uvarint(resp, at);
                let (size, l2) = uvarint(resp, at + l1);
                at += l1 + l2 + size as usize;
            }
        }
        if ![SASL_HANDSHAKE, SASL_AUTHENTICATE].contains(&i16_at(resp, start)) {
            kept.push(&resp[start..at]);
        }
    }
    let ours: [(i16, i16, i16); 2] = [(SASL_HANDSHAKE, 1, 1), (SASL_AUTHENTICATE, 0, 1)];
    let count = kept.len() + ours.len();
    let mut out = resp[..6].to_vec();
    if flexible {
        put_uvarint(&mut out, count as u64 + 1);
    } else {
        out.extend((count as i32).to_be_bytes());
    }
    for e in kept {
        out.extend_from_slice(e);
    }
    for (key, min, max) in ours {
        out.extend(key.to_be_bytes());
        out.extend(min.to_be_bytes());
        out.extend(max.to_be_bytes());
        if flexible {
            out.push(0); // no tagged fields
        }
    }
    out.extend_from_slice(&resp[at..]);
    out
}

/// The body of a request with a v1 header (api key, version, correlation
/// id, client id): what SaslHandshake v1 and SaslAuthenticate v0–1 use.
fn body(req: &[u8]) -> &[u8] {
    let client_id = i16_at(req, 8).max(0) as usize;
    &req[10 + client_id..]
}

/// Does the broker's part of SASL/PLAIN on `client`, forwarding the
/// ApiVersions exchange to tansu; then relays the connection both ways.
fn sasl_relay(mut client: TcpStream, backend: u16) -> std::io::Result<()> {
    let mut tansu = TcpStream::connect(("127.0.0.1", backend))?;
    loop {
        let req = read_frame(&mut client)?;
        let (key, version) = (i16_at(&req, 0), i16_at(&req, 2));
        let mut resp = req[4..8].to_vec(); // correlation id
        match key {
            API_VERSIONS => {
                write_frame(&mut tansu, &req)?;
                let answer = read_frame(&mut tansu)?;
                write_frame(&mut client, &with_sasl_apis(&answer, version))?;
            }
            SASL_HANDSHAKE => {
                resp.extend(0i16.to_be_bytes());
                resp.extend(1i32.to_be_bytes());
                resp.extend(5i16.to_be_bytes());
                resp.extend(b"PLAIN");
                write_frame(&mut client, &resp)?;
            }
            SASL_AUTHENTICATE => {
                let b = body(&req);
                let n = i32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                // PLAIN: authzid \0 user \0 password.
                let token: Vec<&[u8]> = b[4..4 + n].split(|&c| c == 0).collect();
                let ok = token.len() == 3
                    && token[1] == USER.as_bytes()
                    && token[2] == PASSWORD.as_bytes();
                if ok {
                    resp.extend(0i16.to_be_bytes());
                    resp.extend((-1i16).to_be_bytes()); // no error message
                } else {
                    let why = b"wrong user or password";
                    resp.extend(AUTHENTICATION_FAILED.to_be_bytes());
                    resp.extend((why.len() as i16).to_be_bytes());
                    resp.extend(why);
                }
                resp.extend(0i32.to_be_bytes()); // no auth bytes
                if version >= 1 {
                    resp.extend(0i64.to_be_bytes()); // session lifetime
                }
                write_frame(&mut client, &resp)?;
                if !ok {
                    return Ok(());
                }
                break;
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "request {other} before authentication"
                )));
            }
        }
    }
    let (mut c2, mut t2) = (client.try_clone()?, tansu.try_clone()?);
    std::thread::spawn(move || std::io::copy(&mut c2, &mut t2));
    std::io::copy(&mut tansu, &mut client)?;
    Ok(())
}

fn sasl_proxy(listener: TcpListener, backend: u16) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let _ = conn.set_nodelay(true);
            std::thread::spawn(move || sasl_relay(conn, backend));
        }
    });
}

#[test]
fn serve_and_send_over_sasl_plain_answer_every_request_and_a_wrong_password_is_refused() {
    if !tansu_available("kafka_sasl") {
        return;
    }
    let dir = tmp_dir("kafka-sasl");
    let plain_port = free_port();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let sasl_port = listener.local_addr().unwrap().port();
    sasl_proxy(listener, plain_port);
    // Clients learn the proxy's address from the metadata.
    let _broker = Broker::start(plain_port, sasl_port, &dir);
    let brokers = format!("127.0.0.1:{sasl_port}");
    let tag = format!("sasl-{}", std::process::id());
    // No password in the file: it comes from the environment.
    let config = config_creating_topics(
        &dir,
        "sasl.toml",
        &tag,
        &format!(
            "librdkafka = {{ \"security.protocol\" = \"sasl_plaintext\", \
             \"sasl.mechanism\" = \"PLAIN\", \"sasl.username\" = \"{USER}\" }}"
        ),
    );
    let password = [("GRFLOW_KAFKA_SASL_PASSWORD", PASSWORD)];
    serve_and_send_all(&config, &brokers, &password, || {
        // The wrong password: refused, nothing sent.
        let wrong = [("GRFLOW_KAFKA_SASL_PASSWORD", "wrong")];
        let err = refused_send(&config, &brokers, &wrong);
        assert!(err.contains("a refused login ends this way too"), "{err}");
    });
}
