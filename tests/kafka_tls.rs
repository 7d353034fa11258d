//! Kafka over TLS against a real broker. tansu 0.6 speaks plaintext only,
//! so the test puts a TLS-terminating proxy of its own (OpenSSL, a
//! self-signed certificate for 127.0.0.1) in front of a tansu of its own
//! that advertises the proxy's port: every client connection is TLS.
//! `grflow serve` and `grflow send` with `security.protocol = "ssl"` and
//! that certificate as their CA serve and answer every request through it;
//! with another CA, or without TLS, the same config reaches no broker. Skipped with a reason
//! without tansu on PATH (scripts/test.sh installs it).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use common::http::free_port;
use common::own_broker::{
    Broker, config_creating_topics, refused_send, serve_and_send_all, tansu_available,
};
use common::temp::tmp_dir;
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::{BasicConstraints, SubjectAlternativeName};
use openssl::x509::{X509, X509NameBuilder};

/// A self-signed certificate for 127.0.0.1 (its own CA) and its key.
fn self_signed() -> (X509, PKey<Private>) {
    let key = PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "127.0.0.1").unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap();
    b.set_serial_number(&serial).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    let san = SubjectAlternativeName::new()
        .ip("127.0.0.1")
        .build(&b.x509v3_context(None, None))
        .unwrap();
    b.append_extension(san).unwrap();
    b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
        .unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (b.build(), key)
}

/// Accepts TLS on `listener` and relays each connection's plaintext to
/// 127.0.0.1:`backend`, on a thread per connection.
fn tls_proxy(listener: TcpListener, backend: u16, acceptor: Arc<SslAcceptor>) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let acceptor = acceptor.clone();
            std::thread::spawn(move || {
                let _ = relay(conn, backend, &acceptor);
            });
        }
    });
}

fn relay(client: TcpStream, backend: u16, acceptor: &SslAcceptor) -> std::io::Result<()> {
    let mut tls = acceptor.accept(client).map_err(std::io::Error::other)?;
    let mut plain = TcpStream::connect(("127.0.0.1", backend))?;
    // Short read timeouts let one thread serve both directions.
    let tick = Some(Duration::from_millis(1));
    tls.get_ref().set_read_timeout(tick)?;
    plain.set_read_timeout(tick)?;
    tls.get_ref().set_nodelay(true)?;
    plain.set_nodelay(true)?;
    let idle = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tls.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => plain.write_all(&buf[..n])?,
            Err(e) if idle(&e) => {}
            Err(e) => return Err(e),
        }
        match plain.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => tls.write_all(&buf[..n])?,
            Err(e) if idle(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn serve_and_send_over_tls_answer_every_request_and_plaintext_is_refused() {
    if !tansu_available("kafka_tls") {
        return;
    }
    let dir = tmp_dir("kafka-tls");
    let (cert, key) = self_signed();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.to_pem().unwrap()).unwrap();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    acceptor.set_private_key(&key).unwrap();
    let acceptor = Arc::new(acceptor.build());

    let plain_port = free_port();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let tls_port = listener.local_addr().unwrap().port();
    tls_proxy(listener, plain_port, acceptor);
    // Clients learn the proxy's address from the metadata.
    let _broker = Broker::start(plain_port, tls_port, &dir);
    let brokers = format!("127.0.0.1:{tls_port}");
    let tag = format!("tls-{}", std::process::id());
    let tls = config_creating_topics(
        &dir,
        "tls.toml",
        &tag,
        &format!(
            "librdkafka = {{ \"security.protocol\" = \"ssl\", \"ssl.ca.location\" = {:?} }}",
            ca.display().to_string()
        ),
    );
    serve_and_send_all(&tls, &brokers, &[], || {
        // TLS with another CA: the broker's certificate is not trusted.
        let (other_ca, _) = self_signed();
        let other = dir.join("other-ca.pem");
        std::fs::write(&other, other_ca.to_pem().unwrap()).unwrap();
        let untrusted = config_creating_topics(
            &dir,
            "untrusted.toml",
            &tag,
            &format!(
                "librdkafka = {{ \"security.protocol\" = \"ssl\", \"ssl.ca.location\" = {:?} }}",
                other.display().to_string()
            ),
        );
        let err = refused_send(&untrusted, &brokers, &[]);
        assert!(
            err.contains("a failed TLS handshake ends this way too"),
            "{err}"
        );
        // The same topics without TLS: no broker answers through the proxy.
        let plain = config_creating_topics(&dir, "plain.toml", &tag, "");
        let err = refused_send(&plain, &brokers, &[]);
        assert!(err.contains("no Kafka broker answered"), "{err}");
        // Without TLS settings, no hint about them.
        assert!(!err.contains("security.protocol"), "{err}");
    });
}
