//! TLS for the facade: a server config from PEM files, or a self-signed CA and serving
//! certificate generated at start (its CA goes into the kubeconfigs consumers use). The
//! listener that serves over it, and its handshake deadline, are [`crate::kubeapi::serve`]'s.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Generating the self-signed pair failed.
    #[error("generating a self-signed certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// The PEM could not be read.
    #[error("reading PEM failed: {0}")]
    Pem(String),
    /// rustls refused the pair.
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A serving certificate chain and key, and the CA that clients must trust.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The serving certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
    /// The CA certificate clients trust (PEM); the serving certificate itself when given files.
    pub ca_pem: String,
}

/// A fresh CA and a serving certificate signed by it for `hosts` (DNS names or IP addresses).
pub fn self_signed(hosts: &[String]) -> Result<TlsMaterial, TlsError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "Floodgate CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name
        .push(DnType::CommonName, "floodgate");
    let cert = leaf.signed_by(&key, &ca)?;
    Ok(TlsMaterial {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca.pem(),
    })
}

/// A rustls server configuration for the material, offering HTTP/2 and HTTP/1.1.
pub fn server_config(m: &TlsMaterial) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(m.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem(format!("certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes())
        .map_err(|e| TlsError::Pem(format!("key: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_pair_makes_a_server_config() {
        let m = self_signed(&["localhost".into(), "127.0.0.1".into()]).expect("generate");
        assert!(m.ca_pem.contains("BEGIN CERTIFICATE") && m.key_pem.contains("PRIVATE KEY"));
        let cfg = server_config(&m).expect("config");
        assert_eq!(cfg.alpn_protocols[0], b"h2");
        let broken = TlsMaterial {
            key_pem: "nope".into(),
            ..m
        };
        assert!(server_config(&broken).is_err());
    }
}
