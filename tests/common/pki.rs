//! Certificates for the TLS tests, made here with rcgen: CAs, the certificates they sign, and
//! a cluster's peer certificates as PEM files. The server crate's own tests include this file
//! too (`cluster/peer_tests.rs`), so it uses nothing but rcgen and std.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// A self-signed CA named `name`, and what signs with it.
pub fn ca(name: &str) -> (Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// A certificate `issuer` signs for `name`, the hosts `sans` and the uses `usages`: its PEM
/// and its key's.
pub fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    name: &str,
    sans: &[&str],
    usages: &[ExtendedKeyUsagePurpose],
) -> (String, String) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A cluster's peer TLS files in `dir`, named after `name`: a CA of its own, and one
/// certificate it signs for `sans`, good on both sides of mutual TLS (as etcd's peer
/// certificates). The paths of the certificate, its key and the CA.
pub fn peer_files(dir: &Path, name: &str, sans: &[&str]) -> [PathBuf; 3] {
    use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    let (ca_cert, issuer) = ca(&format!("{name} CA"));
    let (cert, key) = leaf(&issuer, name, sans, &[ServerAuth, ClientAuth]);
    let paths = [
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
        dir.join(format!("{name}-ca.pem")),
    ];
    for (path, pem) in paths.iter().zip([cert, key, ca_cert.pem()]) {
        fs::write(path, pem).unwrap();
    }
    paths
}
