//! Throwaway certificates for TLS tests: a CA and a server certificate it
//! signs, made with rcgen (feature `tls`).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

static CAS_MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A CA and a server certificate it signs, all PEM.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA's certificate: what a client trusts (`sslrootcert`).
    pub ca_pem: String,
    /// The server's certificate, for names given to [`TestPki::generate`].
    pub server_cert_pem: String,
    /// The server's private key.
    pub server_key_pem: String,
}

impl TestPki {
    /// A new CA and a server certificate for `names` (DNS names or IP
    /// addresses, each a subject alternative name).
    pub fn generate(names: &[&str]) -> Result<TestPki, String> {
        let err = |what: &str, e: rcgen::Error| format!("{what}: {e}");
        let ca_key = KeyPair::generate().map_err(|e| err("CA key", e))?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| err("CA", e))?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own, so a client holding another test CA fails
        // as with any unknown issuer.
        let n = CAS_MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ca.distinguished_name.push(
            DnType::CommonName,
            format!("spool test CA {}-{n}", std::process::id()),
        );
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca
            .self_signed(&ca_key)
            .map_err(|e| err("CA certificate", e))?;
        let server_key = KeyPair::generate().map_err(|e| err("server key", e))?;
        let mut server =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .map_err(|e| err("server names", e))?;
        server.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("server"),
        );
        let issuer = Issuer::new(ca, ca_key);
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .map_err(|e| err("server certificate", e))?;
        Ok(TestPki {
            ca_pem: ca_cert.pem(),
            server_cert_pem: server_cert.pem(),
            server_key_pem: server_key.serialize_pem(),
        })
    }
}
