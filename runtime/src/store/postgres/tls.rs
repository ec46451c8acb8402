//! TLS for the PostgreSQL store, with libpq's `sslmode` semantics.
//!
//! The connection string's `sslmode` and `sslrootcert` are read here (the
//! client crate knows only `disable`, `prefer` and `require`, and no
//! `sslrootcert`) and removed from it before the rest is parsed:
//!
//! | `sslmode` | encrypts | checks the certificate chain | checks the host name |
//! | --- | --- | --- | --- |
//! | `disable` | no | – | – |
//! | `allow`, `prefer` (the default) | when the server offers TLS | no | no |
//! | `require` | yes | only when a root certificate file exists (as libpq) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! `allow` (libpq: plain first, TLS if refused) is taken as `prefer`: the
//! client cannot retry in that order, and `prefer` is the stronger of the
//! two. `sslrootcert=PATH` names a PEM file of trusted roots; without it
//! the verifying modes read `~/.postgresql/root.crt`, as libpq does, and
//! fail with a clear error when that file is missing. `sslrootcert=system`
//! trusts the system's roots and, as in libpq, implies `verify-full` and
//! refuses any weaker `sslmode`. With `prefer`, a server that offers TLS
//! but fails the handshake is an error (libpq would retry in plain text).
//!
//! TLS is rustls with the ring provider (chosen explicitly, so the
//! process-wide default provider does not matter).

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`, as the store applies it (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(s: &str) -> Result<SslMode, TlsConfigError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" | "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => return Err(TlsConfigError::InvalidSslMode(other.to_string())),
        })
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the TLS settings of a connection string cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigError {
    #[error(
        "invalid sslmode `{0}` (expected disable, allow, prefer, require, verify-ca or verify-full)"
    )]
    InvalidSslMode(String),
    #[error(
        "sslrootcert=system needs sslmode=verify-full (got {0}): anyone can get a publicly \
         trusted certificate for a name they control, so weaker checks prove nothing"
    )]
    SystemRootsNeedVerifyFull(SslMode),
    #[error(
        "sslmode={mode} verifies the server's certificate, but the root certificate file {} \
         does not exist: name one with sslrootcert=PATH, use sslrootcert=system, or use \
         sslmode=require to encrypt without verifying",
        path.display()
    )]
    RootCertMissing { mode: SslMode, path: PathBuf },
    #[error("cannot tell where the default root certificate file is (HOME is not set); name one with sslrootcert=PATH")]
    NoHome,
    #[error("reading the root certificate file {}", path.display())]
    RootCertRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the root certificate file {} holds no usable PEM certificate", path.display())]
    RootCertInvalid {
        path: PathBuf,
        #[source]
        source: Option<rustls::pki_types::pem::Error>,
    },
    #[error("the system's root certificates could not be loaded: {0}")]
    SystemRoots(String),
    #[error("building the certificate verifier")]
    Verifier(#[source] rustls::client::VerifierBuilderError),
    #[error("setting up TLS")]
    Rustls(#[source] rustls::Error),
}

/// The TLS side of a connection: the mode for the client crate and the
/// connector that carries out the checks of `mode`.
#[derive(Clone)]
pub(super) struct TlsSetup {
    pub mode: SslMode,
    pub connector: MakeRustlsConnect,
}

impl std::fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSetup")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl TlsSetup {
    /// The client crate's mode: whether to ask for TLS, and whether to
    /// give up when the server has none. The checks are the connector's.
    pub fn client_mode(&self) -> postgres::config::SslMode {
        match self.mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                postgres::config::SslMode::Require
            }
        }
    }
}

/// The `sslmode` and `sslrootcert` of a connection string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TlsParams {
    pub sslmode: Option<String>,
    pub sslrootcert: Option<String>,
}

/// Splits `sslmode` and `sslrootcert` off a connection string (a
/// `postgres://` URL or `key=value` pairs): the string without them, and
/// their values. A string this cannot read is returned whole, for the
/// client crate to report what is wrong with it.
pub(super) fn split_params(conn_str: &str) -> (String, TlsParams) {
    let lower = conn_str.get(..13).unwrap_or(conn_str).to_ascii_lowercase();
    let is_url = lower.starts_with("postgres://") || lower.starts_with("postgresql://");
    let split = if is_url {
        split_url(conn_str)
    } else {
        split_key_values(conn_str)
    };
    split.unwrap_or_else(|| (conn_str.to_string(), TlsParams::default()))
}

fn take(params: &mut TlsParams, key: &str, value: String) -> bool {
    match key {
        "sslmode" => params.sslmode = Some(value),
        "sslrootcert" => params.sslrootcert = Some(value),
        _ => return false,
    }
    true
}

/// The URL form: parameters follow the first `?` after the credentials
/// (which end at the first `@`, as the client crate reads them).
fn split_url(url: &str) -> Option<(String, TlsParams)> {
    let scheme_end = url.find("://")? + 3;
    let after_creds = url[scheme_end..]
        .find('@')
        .map_or(scheme_end, |at| scheme_end + at + 1);
    let Some(q) = url[after_creds..].find('?').map(|q| after_creds + q) else {
        return Some((url.to_string(), TlsParams::default()));
    };
    let mut params = TlsParams::default();
    let mut kept = Vec::new();
    for pair in url[q + 1..].split('&') {
        let (key, value) = pair.split_once('=')?;
        let key = percent_decode(key)?;
        if !take(&mut params, &key, percent_decode(value)?) {
            kept.push(pair);
        }
    }
    let mut rest = url[..q].to_string();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Some((rest, params))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The `key=value` form, read as the client crate reads it: keys end at
/// whitespace or `=`, values are `'quoted'` or run to whitespace, and a
/// backslash escapes the next character.
fn split_key_values(s: &str) -> Option<(String, TlsParams)> {
    let mut params = TlsParams::default();
    let mut kept = String::new();
    let mut it = s.char_indices().peekable();
    loop {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = it.peek() else {
            break;
        };
        let mut key_end = start;
        while let Some((i, c)) = it.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key_end = i + c.len_utf8();
        }
        let key = &s[start..key_end];
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        it.next_if(|(_, c)| *c == '=')?;
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = it.next_if(|(_, c)| *c == '\'').is_some();
        let mut closed = !quoted;
        while let Some((_, c)) = it.next() {
            if quoted && c == '\'' {
                closed = true;
                break;
            }
            if !quoted && c.is_whitespace() {
                break;
            }
            if c == '\\' {
                value.push(it.next()?.1);
            } else {
                value.push(c);
            }
        }
        if !closed || key.is_empty() {
            return None;
        }
        let end = it.peek().map_or(s.len(), |&(i, _)| i);
        if !take(&mut params, key, value) {
            kept.push_str(s[start..end].trim_end());
            kept.push(' ');
        }
    }
    Some((kept.trim_end().to_string(), params))
}

/// The root certificates a verifying mode trusts.
enum Roots {
    File(PathBuf),
    System,
}

fn default_root_file() -> Result<PathBuf, TlsConfigError> {
    let home = std::env::var_os("HOME").ok_or(TlsConfigError::NoHome)?;
    Ok(PathBuf::from(home).join(".postgresql").join("root.crt"))
}

/// The mode and connector for `params`, with libpq's rules (see the
/// module docs).
pub(super) fn setup(params: &TlsParams) -> Result<TlsSetup, TlsConfigError> {
    let system = params.sslrootcert.as_deref() == Some("system");
    let mut mode = match params.sslmode.as_deref() {
        Some(m) => SslMode::parse(m)?,
        None if system => SslMode::VerifyFull,
        None => SslMode::Prefer,
    };
    if system && mode != SslMode::VerifyFull {
        return Err(TlsConfigError::SystemRootsNeedVerifyFull(mode));
    }
    let roots = match (&params.sslrootcert, mode) {
        (_, SslMode::Disable | SslMode::Prefer) => None,
        (Some(_), _) if system => Some(Roots::System),
        (Some(path), _) => Some(Roots::File(PathBuf::from(path))),
        (None, _) => Some(Roots::File(default_root_file()?)),
    };
    let roots = match roots {
        // libpq: `require` checks the chain when the root file exists.
        Some(Roots::File(path)) if mode == SslMode::Require => {
            if path.exists() {
                mode = SslMode::VerifyCa;
                Some(Roots::File(path))
            } else {
                None
            }
        }
        Some(Roots::File(path)) if !path.exists() => {
            return Err(TlsConfigError::RootCertMissing { mode, path })
        }
        other => other,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Rustls)?;
    let config = match roots {
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCertificateCheck {
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        Some(roots) => {
            let store = Arc::new(root_store(roots)?);
            let webpki = WebPkiServerVerifier::builder_with_provider(store, provider)
                .build()
                .map_err(TlsConfigError::Verifier)?;
            if mode == SslMode::VerifyFull {
                builder.with_webpki_verifier(webpki).with_no_client_auth()
            } else {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
                    .with_no_client_auth()
            }
        }
    };
    Ok(TlsSetup {
        mode,
        connector: MakeRustlsConnect::new(config),
    })
}

fn root_store(roots: Roots) -> Result<RootCertStore, TlsConfigError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let pem = std::fs::read(&path).map_err(|source| TlsConfigError::RootCertRead {
                path: path.clone(),
                source,
            })?;
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| TlsConfigError::RootCertInvalid {
                    path: path.clone(),
                    source: Some(e),
                })?;
            let (added, _ignored) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(TlsConfigError::RootCertInvalid { path, source: None });
            }
        }
        Roots::System => {
            let loaded = rustls_native_certs::load_native_certs();
            if loaded.certs.is_empty() {
                let why = loaded
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_string(), |e| e.to_string());
                return Err(TlsConfigError::SystemRoots(why));
            }
            store.add_parsable_certificates(loaded.certs);
        }
    }
    Ok(store)
}

/// `prefer` and `require` without a root file: encrypt, check nothing
/// about who the server is (the handshake signatures are still checked,
/// so the session keys belong to the certificate presented).
#[derive(Debug)]
struct NoCertificateCheck {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoCertificateCheck {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not
/// checked. The web PKI verifier checks the chain before the name, so a
/// name error means the chain passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The rustls error behind a failed connection attempt, if TLS refused
/// the server (a certificate check, a protocol failure).
pub(super) fn rejection(e: &postgres::Error) -> Option<&rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = cur {
        if let Some(r) = s.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        // io::Error::source skips the error it wraps.
        if let Some(inner) = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<rustls::Error>())
        {
            return Some(inner);
        }
        cur = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Option<String>, Option<String>) {
        let (rest, p) = split_params(s);
        (rest, p.sslmode, p.sslrootcert)
    }

    #[test]
    fn url_params_are_split_off() {
        assert_eq!(
            split("postgres://u:p%3F@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem"),
            (
                "postgres://u:p%3F@h:5/db?application_name=x".to_string(),
                Some("verify-full".into()),
                Some("/tmp/ca.pem".into())
            )
        );
        assert_eq!(
            split("postgresql://h/db?sslmode=require"),
            (
                "postgresql://h/db".to_string(),
                Some("require".into()),
                None
            )
        );
        assert_eq!(
            split("postgres://h/db"),
            ("postgres://h/db".to_string(), None, None)
        );
        // A `?` in the credentials is not the start of the parameters.
        assert_eq!(
            split("postgres://u:a?b@h/db?sslmode=disable"),
            (
                "postgres://u:a?b@h/db".to_string(),
                Some("disable".into()),
                None
            )
        );
    }

    #[test]
    fn key_value_params_are_split_off() {
        assert_eq!(
            split(
                "host=h sslmode = verify-ca  sslrootcert='/a b/c\\'d.pem' options='-c x=y' port=5"
            ),
            (
                "host=h options='-c x=y' port=5".to_string(),
                Some("verify-ca".into()),
                Some("/a b/c'd.pem".into())
            )
        );
        // Unreadable strings are left whole for the client to report.
        assert_eq!(split("host='h"), ("host='h".to_string(), None, None));
    }

    #[test]
    fn modes_follow_libpq() {
        let p = |m: Option<&str>, r: Option<&str>| TlsParams {
            sslmode: m.map(String::from),
            sslrootcert: r.map(String::from),
        };
        assert_eq!(setup(&p(None, None)).unwrap().mode, SslMode::Prefer);
        assert_eq!(
            setup(&p(Some("allow"), None)).unwrap().mode,
            SslMode::Prefer
        );
        let missing = "/nonexistent/spool-root.crt";
        assert_eq!(
            setup(&p(Some("require"), Some(missing))).unwrap().mode,
            SslMode::Require
        );
        let e = setup(&p(Some("verify-full"), Some(missing))).unwrap_err();
        assert!(matches!(e, TlsConfigError::RootCertMissing { .. }), "{e}");
        assert!(e.to_string().contains(missing), "{e}");
        let e = setup(&p(Some("require"), Some("system"))).unwrap_err();
        assert!(
            matches!(
                e,
                TlsConfigError::SystemRootsNeedVerifyFull(SslMode::Require)
            ),
            "{e}"
        );
        let e = setup(&p(Some("verify_full"), None)).unwrap_err();
        assert!(matches!(e, TlsConfigError::InvalidSslMode(_)), "{e}");
    }
}
