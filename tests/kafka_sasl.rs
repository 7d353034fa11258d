//! Kafka with SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER)
//! against a real
//! broker. tansu 0.6 has no SASL, so
//! the test puts a proxy of its own in front of a tansu of its own that
//! advertises the proxy's port. The proxy does the broker's part of the
//! SASL exchange (Kafka's SaslHandshake and SaslAuthenticate requests,
//! added to tansu's ApiVersions answer) and checks the user and password
//! (SCRAM: the client's proof, and the client checks the proxy's signature),
//! then relays the connection. `grflow serve` and `grflow send` with
//! `security.protocol = "sasl_plaintext"` and the password from
//! GRFLOW_KAFKA_SASL_PASSWORD (not the config file) answer every request;
//! a wrong password is refused. OAUTHBEARER with librdkafka's unsecured
//! JWT: the proxy reads the bearer token's subject and expiry, and a token
//! for another principal is refused. Skipped with a reason without tansu
//! on PATH.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;

use common::http::free_port;
use common::own_broker::{
    Broker, config_creating_topics, refused_send, serve_and_send_all, tansu_available,
};
use common::temp::tmp_dir;
use openssl::base64;
use openssl::hash::{MessageDigest, hash};
use openssl::pkcs5;
use openssl::pkey::PKey;
use openssl::sign::Signer;

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

/// The SASL mechanism the proxy offers (the only one it accepts).
#[derive(Clone, Copy)]
enum Mechanism {
    Plain,
    /// SCRAM-SHA-256 or -512 (RFC 5802 / 7677): two rounds, the password
    /// never on the wire, and the client checks the server's signature.
    Scram(fn() -> MessageDigest, &'static str),
    /// OAUTHBEARER (RFC 7628): one message carrying a bearer token; the
    /// proxy accepts a JWT for [`USER`] that has not expired.
    OAuthBearer,
}

impl Mechanism {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(_, name) => name,
            Self::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// Checks an OAUTHBEARER client message (`n,,\x01auth=Bearer <jwt>\x01\x01`):
/// the JWT's subject is [`USER`] and it has not expired. (An unsecured
/// JWT, as librdkafka makes for testing: nothing to verify a signature of.)
fn bearer_ok(message: &[u8]) -> Result<(), &'static str> {
    let text = std::str::from_utf8(message).map_err(|_| "not UTF-8")?;
    let token = text
        .split('\x01')
        .find_map(|kv| kv.strip_prefix("auth=Bearer "))
        .ok_or("no bearer token")?;
    let payload = token.split('.').nth(1).ok_or("not a JWT")?;
    // base64url without padding, as JWTs are written.
    let mut b64: String = payload
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !b64.len().is_multiple_of(4) {
        b64.push('=');
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&base64::decode_block(&b64).map_err(|_| "bad base64")?)
            .map_err(|_| "bad claims")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    match (claims["sub"].as_str(), claims["exp"].as_f64()) {
        (Some(USER), Some(exp)) if exp > now => Ok(()),
        (Some(USER), _) => Err("expired token"),
        _ => Err("token for another principal"),
    }
}

const SCRAM_ITERATIONS: usize = 4096;

fn hmac(md: MessageDigest, key: &[u8], data: &[u8]) -> Vec<u8> {
    let key = PKey::hmac(key).unwrap();
    let mut signer = Signer::new(md, &key).unwrap();
    signer.update(data).unwrap();
    signer.sign_to_vec().unwrap()
}

/// The server's side of one SCRAM exchange, as RFC 5802 §3 defines it.
struct Scram {
    md: MessageDigest,
    salt: Vec<u8>,
    /// client-first-message-bare and server-first-message, once sent.
    first: Option<(String, String)>,
}

impl Scram {
    fn new(md: MessageDigest) -> Self {
        let mut salt = vec![0u8; 16];
        openssl::rand::rand_bytes(&mut salt).unwrap();
        Self {
            md,
            salt,
            first: None,
        }
    }

    fn attr<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
        msg.split(',')
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    }

    /// client-first "n,,n=USER,r=NONCE" → server-first "r=NONCE+OURS,s=SALT,i=N";
    /// `None` for another user or a malformed message.
    fn server_first(&mut self, client_first: &str) -> Option<String> {
        let bare = client_first.strip_prefix("n,,")?;
        if Self::attr(bare, "n")? != USER {
            return None;
        }
        let mut ours = [0u8; 18];
        openssl::rand::rand_bytes(&mut ours).unwrap();
        let reply = format!(
            "r={}{},s={},i={SCRAM_ITERATIONS}",
            Self::attr(bare, "r")?,
            base64::encode_block(&ours),
            base64::encode_block(&self.salt)
        );
        self.first = Some((bare.to_string(), reply.clone()));
        Some(reply)
    }

    /// client-final "c=biws,r=NONCE,p=PROOF": the proof checked against
    /// the password → server-final "v=SIGNATURE"; `None` if it is wrong.
    fn server_final(&self, client_final: &str) -> Option<String> {
        let (bare, first) = self.first.as_ref()?;
        let (without_proof, proof) = client_final.rsplit_once(",p=")?;
        if Self::attr(without_proof, "r")? != Self::attr(first, "r")? {
            return None;
        }
        let mut salted = vec![0u8; self.md.size()];
        pkcs5::pbkdf2_hmac(
            PASSWORD.as_bytes(),
            &self.salt,
            SCRAM_ITERATIONS,
            self.md,
            &mut salted,
        )
        .unwrap();
        let client_key = hmac(self.md, &salted, b"Client Key");
        let stored_key = hash(self.md, &client_key).unwrap();
        let auth_message = format!("{bare},{first},{without_proof}");
        let signature = hmac(self.md, &stored_key, auth_message.as_bytes());
        let proof = base64::decode_block(proof).ok()?;
        let claimed: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        if proof.len() != signature.len() || *hash(self.md, &claimed).unwrap() != *stored_key {
            return None;
        }
        let server_key = hmac(self.md, &salted, b"Server Key");
        let server_signature = hmac(self.md, &server_key, auth_message.as_bytes());
        Some(format!("v={}", base64::encode_block(&server_signature)))
    }
}

/// A SaslAuthenticate v0–1 answer: `error` (with its message) or `bytes`.
fn authenticate_answer(correlation: &[u8], version: i16, outcome: Result<&[u8], &str>) -> Vec<u8> {
    let mut resp = correlation.to_vec();
    match outcome {
        Ok(_) => {
            resp.extend(0i16.to_be_bytes());
            resp.extend((-1i16).to_be_bytes()); // no error message
        }
        Err(why) => {
            resp.extend(AUTHENTICATION_FAILED.to_be_bytes());
            resp.extend((why.len() as i16).to_be_bytes());
            resp.extend(why.as_bytes());
        }
    }
    let bytes = outcome.unwrap_or_default();
    resp.extend((bytes.len() as i32).to_be_bytes());
    resp.extend(bytes);
    if version >= 1 {
        resp.extend(0i64.to_be_bytes()); // session lifetime
    }
    resp
}

/// Does the broker's part of SASL (`mechanism`) on `client`, forwarding the
/// ApiVersions exchange to tansu; then relays the connection both ways.
fn sasl_relay(mut client: TcpStream, backend: u16, mechanism: Mechanism) -> std::io::Result<()> {
    let mut tansu = TcpStream::connect(("127.0.0.1", backend))?;
    let mut scram = match mechanism {
        Mechanism::Scram(md, _) => Some(Scram::new(md())),
        Mechanism::Plain | Mechanism::OAuthBearer => None,
    };
    loop {
        let req = read_frame(&mut client)?;
        let (key, version) = (i16_at(&req, 0), i16_at(&req, 2));
        let correlation = &req[4..8];
        match key {
            API_VERSIONS => {
                write_frame(&mut tansu, &req)?;
                let answer = read_frame(&mut tansu)?;
                write_frame(&mut client, &with_sasl_apis(&answer, version))?;
            }
            SASL_HANDSHAKE => {
                let name = mechanism.name();
                let mut resp = correlation.to_vec();
                resp.extend(0i16.to_be_bytes());
                resp.extend(1i32.to_be_bytes());
                resp.extend((name.len() as i16).to_be_bytes());
                resp.extend(name.as_bytes());
                write_frame(&mut client, &resp)?;
            }
            SASL_AUTHENTICATE => {
                let b = body(&req);
                let n = i32::from_be_bytes(b[..4].try_into().unwrap()) as usize;
                let token = &b[4..4 + n];
                // (answer bytes, whether authentication is complete)
                let outcome: Result<(Vec<u8>, bool), &str> = match &mut scram {
                    None if matches!(mechanism, Mechanism::OAuthBearer) => {
                        bearer_ok(token).map(|()| (Vec::new(), true))
                    }
                    None => {
                        // PLAIN: authzid \0 user \0 password.
                        let parts: Vec<&[u8]> = token.split(|&c| c == 0).collect();
                        let ok = parts.len() == 3
                            && parts[1] == USER.as_bytes()
                            && parts[2] == PASSWORD.as_bytes();
                        ok.then(|| (Vec::new(), true))
                            .ok_or("wrong user or password")
                    }
                    Some(scram) => {
                        let text = String::from_utf8_lossy(token);
                        if scram.first.is_none() {
                            scram
                                .server_first(&text)
                                .map(|m| (m.into_bytes(), false))
                                .ok_or("unknown user")
                        } else {
                            scram
                                .server_final(&text)
                                .map(|m| (m.into_bytes(), true))
                                .ok_or("wrong user or password")
                        }
                    }
                };
                let answer = match &outcome {
                    Ok((bytes, _)) => Ok(bytes.as_slice()),
                    Err(why) => Err(*why),
                };
                write_frame(
                    &mut client,
                    &authenticate_answer(correlation, version, answer),
                )?;
                match outcome {
                    Err(_) => return Ok(()),
                    Ok((_, true)) => break,
                    Ok((_, false)) => {}
                }
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

fn sasl_proxy(listener: TcpListener, backend: u16, mechanism: Mechanism) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let _ = conn.set_nodelay(true);
            std::thread::spawn(move || sasl_relay(conn, backend, mechanism));
        }
    });
}

/// A tansu of the test's own behind a proxy offering `mechanism`: the
/// broker (stopped when dropped), the test's directory, the proxy's address
/// and a tag for topic names. `None` (said) without tansu.
fn proxied_broker(mechanism: Mechanism, test: &str) -> Option<(Broker, PathBuf, String, String)> {
    if !tansu_available(test) {
        return None;
    }
    let dir = tmp_dir(test);
    let plain_port = free_port();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let sasl_port = listener.local_addr().unwrap().port();
    sasl_proxy(listener, plain_port, mechanism);
    // Clients learn the proxy's address from the metadata.
    let broker = Broker::start(plain_port, sasl_port, &dir);
    let brokers = format!("127.0.0.1:{sasl_port}");
    let tag = format!("{test}-{}", std::process::id());
    Some((broker, dir, brokers, tag))
}

/// `grflow serve` and `grflow send` through a proxy offering `mechanism`
/// answer every request; a wrong password is refused.
fn serve_and_send_with(mechanism: Mechanism, test: &str) {
    let Some((_broker, dir, brokers, tag)) = proxied_broker(mechanism, test) else {
        return;
    };
    // No password in the file: it comes from the environment.
    let config = config_creating_topics(
        &dir,
        "sasl.toml",
        &tag,
        &format!(
            "librdkafka = {{ \"security.protocol\" = \"sasl_plaintext\", \
             \"sasl.mechanism\" = \"{}\", \"sasl.username\" = \"{USER}\" }}",
            mechanism.name()
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

#[test]
fn serve_and_send_over_sasl_plain_answer_every_request_and_a_wrong_password_is_refused() {
    serve_and_send_with(Mechanism::Plain, "kafka-sasl-plain");
}

/// SCRAM-SHA-512, as Amazon MSK uses.
#[test]
fn serve_and_send_over_scram_sha_512_answer_every_request_and_a_wrong_password_is_refused() {
    serve_and_send_with(
        Mechanism::Scram(MessageDigest::sha512, "SCRAM-SHA-512"),
        "kafka-sasl-scram-512",
    );
}

#[test]
fn serve_and_send_over_scram_sha_256_answer_every_request_and_a_wrong_password_is_refused() {
    serve_and_send_with(
        Mechanism::Scram(MessageDigest::sha256, "SCRAM-SHA-256"),
        "kafka-sasl-scram-256",
    );
}

/// OAUTHBEARER with librdkafka's unsecured JWT (`sasl.oauthbearer.config`
/// names the principal; no password): every request is answered, and a
/// token for another principal is refused with the hint naming the token's
/// settings.
#[test]
fn serve_and_send_over_oauthbearer_answer_every_request_and_another_principal_is_refused() {
    let Some((_broker, dir, brokers, tag)) =
        proxied_broker(Mechanism::OAuthBearer, "kafka-sasl-oauthbearer")
    else {
        return;
    };
    let bearer = |principal: &str| {
        format!(
            "librdkafka = {{ \"security.protocol\" = \"sasl_plaintext\", \
             \"sasl.mechanism\" = \"OAUTHBEARER\", \
             \"enable.sasl.oauthbearer.unsecure.jwt\" = \"true\", \
             \"sasl.oauthbearer.config\" = \"principal={principal}\" }}"
        )
    };
    let config = config_creating_topics(&dir, "bearer.toml", &tag, &bearer(USER));
    let other = config_creating_topics(&dir, "other.toml", &tag, &bearer("intruder"));
    serve_and_send_all(&config, &brokers, &[], || {
        let err = refused_send(&other, &brokers, &[]);
        assert!(
            err.contains("a refused login ends this way too") && err.contains("sasl.oauthbearer.*"),
            "{err}"
        );
    });
}
