//! PEM files as rustls takes them: a certificate chain, its private key and the CAs trusted to
//! sign the other side's certificate. The client TLS port (`server/tls.rs`) and the cluster
//! port (`cluster/tls.rs`) read theirs alike; an error names the file.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// An option's value that does not do: what to fix, in words.
pub fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

fn in_file(path: &Path, e: impl std::fmt::Display) -> io::Error {
    invalid(format!("{}: {e}", path.display()))
}

/// The certificate chain in `path`, leaf first.
pub fn certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| in_file(path, e))?;
    match certs.is_empty() {
        true => Err(in_file(path, "no certificate in it")),
        false => Ok(certs),
    }
}

/// The private key in `path`.
pub fn key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| in_file(path, e))
}

/// The CAs in `path`: the only signers trusted for the other side's certificate.
pub fn roots(path: &Path) -> io::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| in_file(path, e))? {
        roots
            .add(cert.map_err(|e| in_file(path, e))?)
            .map_err(|e| in_file(path, e))?;
    }
    match roots.is_empty() {
        true => Err(in_file(path, "no CA certificate in it")),
        false => Ok(Arc::new(roots)),
    }
}

/// The one crypto provider of every TLS configuration (ring: no C build).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
