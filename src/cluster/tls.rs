//! How the cluster port's connections are carried (SPEC §17): in the clear, allowed only while
//! every peer address is loopback, or in TLS with mutual authentication, which keeps lease ids
//! (capabilities) and every replicated field private and tamper-proof on the path between
//! nodes. The cluster-secret handshake (`auth.rs`) runs inside either.
//!
//! Both sides present a certificate signed by the cluster's CA (`--cluster-tls-ca-cert-file`,
//! as etcd's `--peer-trusted-ca-file`); the dialing side also checks that the listener's
//! certificate names the host it dialed (the peer address in the membership), as etcd does.
//! A record altered on the way fails rustls's authentication: the receiving side drops the
//! connection, and what it carried is sent again on a new one.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};
use tokio_util::either::Either;

use crate::pem::{self, invalid};

/// A connection of the cluster port, either way carried.
pub type PeerConn = Either<TcpStream, TlsStream<TcpStream>>;

/// Plain TCP or mutual TLS.
#[derive(Clone, Default)]
pub enum Transport {
    /// In the clear: every peer address is loopback.
    #[default]
    Plain,
    /// Mutual TLS.
    Tls(Arc<PeerTls>),
}

/// The two sides of mutual TLS from one certificate, key and CA.
pub struct PeerTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Plain => "plain",
            Transport::Tls(_) => "mutual TLS",
        })
    }
}

impl Transport {
    /// Mutual TLS with this node's certificate chain and key and the cluster's CA (PEM files).
    pub fn tls(cert: &Path, key: &Path, ca: &Path) -> io::Result<Transport> {
        let (certs, key, roots) = (pem::certs(cert)?, pem::key(key)?, pem::roots(ca)?);
        let provider = pem::provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| invalid(format!("{}: {e}", cert.display())))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| invalid(format!("{}: {e}", cert.display())))?;
        Ok(Transport::Tls(Arc::new(PeerTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })))
    }

    /// Whether peer traffic is private.
    pub fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(_))
    }

    /// The connection `tcp`, dialed to `addr` (`host:port`), carried this way.
    pub async fn dial(&self, tcp: TcpStream, addr: &str) -> io::Result<PeerConn> {
        let Transport::Tls(tls) = self else {
            return Ok(Either::Left(tcp));
        };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name =
            ServerName::try_from(host.to_string()).map_err(|e| invalid(format!("{addr}: {e}")))?;
        let conn = tls.connector.connect(name, tcp).await.map_err(refused)?;
        Ok(Either::Right(conn.into()))
    }

    /// The connection `tcp`, accepted on the cluster port, carried this way.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<PeerConn> {
        let Transport::Tls(tls) = self else {
            return Ok(Either::Left(tcp));
        };
        let conn = tls.acceptor.accept(tcp).await.map_err(refused)?;
        Ok(Either::Right(conn.into()))
    }
}

/// A handshake that failed on TLS's own grounds (an unknown CA, a name the certificate does
/// not carry, no certificate) is a refusal, as a wrong secret is: it will not get better by
/// waiting. A connection lost meanwhile stays what it was.
fn refused(e: io::Error) -> io::Error {
    if is_tls_error(&e) {
        io::Error::new(io::ErrorKind::PermissionDenied, format!("TLS: {e}"))
    } else {
        e
    }
}

/// Whether `e` is rustls's: a handshake refused, or a record that failed its authentication
/// (altered on the way).
pub fn is_tls_error(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}
