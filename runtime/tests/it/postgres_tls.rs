//! TLS with libpq's `sslmode` semantics, against throwaway servers started
//! with `ssl=on` and certificates made in Rust (a test CA signing the
//! server's certificate). Skipped loudly when the machine cannot run a
//! server, except under CI.

use crate::postgres_support;

use std::path::{Path, PathBuf};

use postgres_support::PgServer;
use spool_pgserver::{ServerTls, TestPki};
use spool_runtime::store::postgres::{PostgresError, PostgresOptions, PostgresStore, SslMode};
use spool_runtime::store::{SessionStore, StoreError};
use spool_runtime::{AgentDefinition, AgentSession};

/// The whole error chain, as the CLI prints it.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(" | ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn pki(names: &[&str]) -> TestPki {
    TestPki::generate(names).expect("test certificates")
}

fn write_pem(dir: &Path, name: &str, pem: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, pem).expect("write PEM");
    path.to_string_lossy().into_owned()
}

/// A URL for `host` on the server's port with the given parameters.
fn url(server: &PgServer, host: &str, params: &str) -> String {
    format!(
        "postgres://postgres@{host}:{}/postgres?{params}",
        server.port()
    )
}

fn connect(url: &str) -> Result<PostgresStore, StoreError> {
    // A few reconnects, so a TLS failure that were retried would still
    // end (the store gives up on TLS failures at once).
    PostgresStore::connect_with(url, PostgresOptions::default().reconnect_attempts(2))
}

/// Connects, and round-trips a session through the store.
fn works(url: &str) {
    let store = match connect(url) {
        Ok(s) => s,
        Err(e) => panic!("{url}: {}", chain(&e)),
    };
    let s = AgentSession::new(
        AgentDefinition::new("tls", "TLS test agent", "Be brief."),
        None,
    );
    let id = s.id().clone();
    store.create(s).expect("create over TLS");
    assert!(store.load(&id).expect("load over TLS").is_some());
}

/// Fails to connect; the error's chain.
fn fails(url: &str) -> (StoreError, String) {
    match connect(url) {
        Ok(_) => panic!("{url} connected"),
        Err(e) => {
            let msg = chain(&e);
            (e, msg)
        }
    }
}

fn postgres_error(e: &StoreError) -> &PostgresError {
    match e {
        StoreError::Backend(b) => b
            .downcast_ref::<PostgresError>()
            .expect("a PostgreSQL store error"),
        other => panic!("not a backend error: {other}"),
    }
}

fn tls_mode_of(e: &StoreError) -> SslMode {
    match postgres_error(e) {
        PostgresError::Tls { mode, .. } => *mode,
        other => panic!("not a TLS failure: {}", chain(other)),
    }
}

/// A server whose TCP connections must use TLS; a certificate for
/// `localhost` and 127.0.0.1 signed by the test CA.
#[test]
fn sslmodes_against_a_tls_only_server() {
    let ca = pki(&["localhost", "127.0.0.1"]);
    let Some(server) = PgServer::start_tls_or_skip(
        "sslmodes_against_a_tls_only_server",
        &ServerTls {
            cert_pem: &ca.server_cert_pem,
            key_pem: &ca.server_key_pem,
            hostssl_only: true,
        },
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = write_pem(dir.path(), "root.pem", &ca.ca_pem);
    let other_root = write_pem(dir.path(), "other.pem", &pki(&["localhost"]).ca_pem);
    let h = "127.0.0.1";

    // Encrypting modes connect (the server refuses plain TCP, so a
    // connection is a TLS connection).
    works(&url(&server, h, "sslmode=require"));
    works(&url(&server, h, "sslmode=prefer"));
    works(&format!(
        "postgres://postgres@{h}:{}/postgres",
        server.port()
    ));
    works(&url(
        &server,
        h,
        &format!("sslmode=verify-full&sslrootcert={root}"),
    ));
    works(&url(
        &server,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={root}"),
    ));
    works(&url(
        &server,
        h,
        &format!("sslmode=verify-ca&sslrootcert={root}"),
    ));
    // The key=value form takes the same settings.
    works(&format!(
        "host={h} port={} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{root}'",
        server.port()
    ));

    // disable: the server's refusal, as it says it.
    let (_, msg) = fails(&url(&server, h, "sslmode=disable"));
    assert!(msg.contains("no encryption"), "{msg}");

    // Verifying without a root certificate file: refused before
    // connecting, naming the file and the ways out.
    let missing = dir.path().join("missing.pem");
    let (e, msg) = fails(&url(
        &server,
        h,
        &format!("sslmode=verify-full&sslrootcert={}", missing.display()),
    ));
    assert!(
        matches!(postgres_error(&e), PostgresError::TlsSettings(_)),
        "{msg}"
    );
    assert!(
        msg.contains("missing.pem") && msg.contains("does not exist"),
        "{msg}"
    );
    assert!(msg.contains("sslmode=require"), "{msg}");

    // A root that did not sign the server's certificate.
    for mode in ["verify-full", "verify-ca"] {
        let (e, msg) = fails(&url(
            &server,
            h,
            &format!("sslmode={mode}&sslrootcert={other_root}"),
        ));
        assert_eq!(tls_mode_of(&e).as_str(), mode, "{msg}");
        assert!(msg.contains(&format!("sslmode={mode}")), "{msg}");
        assert!(
            msg.contains("invalid peer certificate: UnknownIssuer"),
            "{msg}"
        );
    }
}

/// A certificate for a name the client does not connect by:
/// `verify-full` refuses it, `verify-ca` (and `require` with a root file,
/// as libpq) accept it.
#[test]
fn verify_full_checks_the_host_name() {
    let ca = pki(&["db.spool.test"]);
    let Some(server) = PgServer::start_tls_or_skip(
        "verify_full_checks_the_host_name",
        &ServerTls {
            cert_pem: &ca.server_cert_pem,
            key_pem: &ca.server_key_pem,
            hostssl_only: false,
        },
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = write_pem(dir.path(), "root.pem", &ca.ca_pem);
    let h = "127.0.0.1";

    let (e, msg) = fails(&url(
        &server,
        h,
        &format!("sslmode=verify-full&sslrootcert={root}"),
    ));
    assert_eq!(tls_mode_of(&e), SslMode::VerifyFull, "{msg}");
    assert!(msg.contains("not valid for name"), "{msg}");
    assert!(msg.contains("127.0.0.1"), "{msg}");

    works(&url(
        &server,
        h,
        &format!("sslmode=verify-ca&sslrootcert={root}"),
    ));
    works(&url(
        &server,
        h,
        &format!("sslmode=require&sslrootcert={root}"),
    ));
    // The name the certificate holds, reached through `hostaddr`.
    works(&url(
        &server,
        "db.spool.test",
        &format!("sslmode=verify-full&sslrootcert={root}&hostaddr={h}"),
    ));
}

/// `require` against a server without TLS fails and says why; `prefer`
/// falls back to plain text.
#[test]
fn require_fails_against_a_server_without_tls() {
    let Some(server) = PgServer::start_or_skip("require_fails_against_a_server_without_tls") else {
        return;
    };
    let h = "127.0.0.1";
    let (e, msg) = fails(&url(&server, h, "sslmode=require"));
    assert_eq!(tls_mode_of(&e), SslMode::Require, "{msg}");
    assert!(msg.contains("does not support TLS"), "{msg}");
    works(&url(&server, h, "sslmode=prefer"));
    works(&url(&server, h, "sslmode=disable"));
}
