//! The public listener's TLS: rustls with the ring provider, TLS 1.2 and
//! 1.3 only, ALPN `h2` then `http/1.1`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// ALPN protocols offered, in preference order.
pub const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading certificate chain {0}: {1}")]
    Certs(PathBuf, rustls_pki_types::pem::Error),
    #[error("reading private key {0}: {1}")]
    Key(PathBuf, rustls_pki_types::pem::Error),
    #[error("certificate chain {0} is empty")]
    EmptyChain(PathBuf),
    #[error("building TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider used everywhere in the project (one provider only).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the server config from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certs(cert.to_path_buf(), e))?;
    if chain.is_empty() {
        return Err(TlsError::EmptyChain(cert.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key(key.to_path_buf(), e))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
