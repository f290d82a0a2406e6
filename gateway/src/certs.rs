//! Development PKI: a local CA and a server certificate it signs.
//!
//! `gateway certs --out DIR` (and `gateway up` on first run) writes
//! `ca.pem`, `ca.key`, `server.pem` and `server.key`. The server certificate
//! covers `localhost`, `127.0.0.1` and `::1`. Clients trust `ca.pem`
//! (`curl --cacert certs/ca.pem`). Keys are written with mode 0600 and are
//! git-ignored: they are generated, never committed.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Paths of a generated development PKI.
#[derive(Debug, Clone)]
pub struct DevPki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

impl DevPki {
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }

    pub fn exists(&self) -> bool {
        self.ca_cert.exists() && self.server_cert.exists() && self.server_key.exists()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

/// Generates a new CA and server certificate into `dir` (created if needed),
/// replacing any there.
pub fn generate(dir: &Path) -> Result<DevPki, CertError> {
    generate_for(dir, &[])
}

/// [`generate`], the server certificate also naming `extra` (host names
/// or IP addresses: a development fleet's hosts).
pub fn generate_for(dir: &Path, extra: &[String]) -> Result<DevPki, CertError> {
    fs::create_dir_all(dir).map_err(|e| CertError::Write(dir.to_path_buf(), e))?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name.push(DnType::CommonName, "slo-gateway development CA");
    ca.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca, ca_key)?;

    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    names.extend(extra.iter().cloned());
    let mut server = CertificateParams::new(names)?;
    server.distinguished_name.push(DnType::CommonName, "localhost");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let server_key = KeyPair::generate()?;
    let server_cert = server.signed_by(&server_key, &ca)?;

    let pki = DevPki::in_dir(dir);
    write(&pki.ca_cert, &ca.pem(), 0o644)?;
    write(&dir.join("ca.key"), &ca_key_pem, 0o600)?;
    write(&pki.server_cert, &server_cert.pem(), 0o644)?;
    write(&pki.server_key, &server_key.serialize_pem(), 0o600)?;
    Ok(pki)
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| CertError::Write(path.to_path_buf(), e))?;
    f.write_all(contents.as_bytes()).map_err(|e| CertError::Write(path.to_path_buf(), e))
}

/// The development admin token in `dir/admin.token`, made (32 random hex
/// digits, mode 0600) when absent. `gateway up` uses it when the config
/// names no admin tokens.
pub fn dev_admin_token(dir: &Path) -> Result<(PathBuf, String), CertError> {
    dev_secret(dir, "admin.token")
}

/// The engine API token `gateway up` gives its engine children and sends
/// them (`dir/engine.token`, made like the admin token).
pub fn dev_engine_token(dir: &Path) -> Result<(PathBuf, String), CertError> {
    dev_secret(dir, "engine.token")
}

/// The key `gateway up` signs policies in Redis with (`dir/policy.key`).
pub fn dev_policy_key(dir: &Path) -> Result<(PathBuf, String), CertError> {
    dev_secret(dir, "policy.key")
}

fn dev_secret(dir: &Path, name: &str) -> Result<(PathBuf, String), CertError> {
    let path = dir.join(name);
    if let Ok(existing) = fs::read_to_string(&path) {
        if existing.trim().len() >= 16 {
            return Ok((path, existing.trim().to_string()));
        }
    }
    fs::create_dir_all(dir).map_err(|e| CertError::Write(dir.to_path_buf(), e))?;
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| CertError::Write(path.clone(), e))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write(&path, &format!("{token}\n"), 0o600)?;
    Ok((path, token))
}
