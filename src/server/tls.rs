//! TLS (rustls): the server certificate, and client certificates when a CA is configured.

use std::io;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;

use crate::config::Config;
use crate::pem::{self, invalid};

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
    let certs = pem::certs(cert_file)?;
    let key = pem::key(key_file)?;
    let provider = pem::provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?;
    let builder = match &c.tls_ca_cert_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(pem::roots(ca_file)?, provider)
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
