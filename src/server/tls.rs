//! TLS (rustls): the server certificate, and client certificates when a CA is configured.

use std::io;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Config;

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// The TLS configuration of `--tls-port`, or `None` when TLS is off.
pub fn server_config(c: &Config) -> io::Result<Option<Arc<ServerConfig>>> {
    if c.tls_port.is_none() {
        return Ok(None);
    }
    let (Some(cert_file), Some(key_file)) = (&c.tls_cert_file, &c.tls_key_file) else {
        return Err(invalid(
            "--tls-port needs --tls-cert-file and --tls-key-file".into(),
        ));
    };
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid(format!("{}: {e}", cert_file.display())))?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| invalid(format!("{}: {e}", key_file.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?;
    let builder = match &c.tls_ca_cert_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca_file)
                .map_err(|e| invalid(format!("{}: {e}", ca_file.display())))?
            {
                let cert = cert.map_err(|e| invalid(format!("{}: {e}", ca_file.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("{}: {e}", ca_file.display())))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| invalid(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(format!("TLS certificate/key: {e}")))?;
    Ok(Some(Arc::new(config)))
}
