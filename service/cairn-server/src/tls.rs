//! Native HTTPS on the listener, for clients (MCP ones among them) that connect without
//! a proxy in front: a certificate chain and key from PEM files (`CAIRN_TLS_CERT`,
//! `CAIRN_TLS_KEY`), read again when either file changes, so a renewed certificate is
//! served without a restart. A renewal that cannot be read keeps the one in service.

use anyhow::Context;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

/// How often, at most, a handshake looks at the files' modification times.
const RECHECK_EVERY: Duration = Duration::from_secs(1);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The chain and key of two PEM files, checked to belong together.
fn load(certificate: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(certificate)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| anyhow::anyhow!("CAIRN_TLS_CERT: cannot read {}: {error}", certificate.display()))?;
    if chain.is_empty() {
        anyhow::bail!("CAIRN_TLS_CERT: {} holds no certificate", certificate.display());
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|error| anyhow::anyhow!("CAIRN_TLS_KEY: cannot read {}: {error}", key.display()))?;
    let certified = CertifiedKey::from_der(chain, private, &provider())
        .with_context(|| format!("CAIRN_TLS_KEY: {} does not fit the certificate", key.display()))?;
    Ok(certified)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|meta| meta.modified()).ok()
}

/// Serves the certificate of two files, reloading it when they change.
#[derive(Debug)]
pub struct ReloadingCertificate {
    certificate: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<CertifiedKey>, Option<SystemTime>, Option<SystemTime>)>,
    checked: Mutex<Instant>,
}

impl ReloadingCertificate {
    pub fn new(certificate: &Path, key: &Path) -> anyhow::Result<Self> {
        let loaded = load(certificate, key)?;
        Ok(ReloadingCertificate {
            certificate: certificate.to_owned(),
            key: key.to_owned(),
            current: RwLock::new((Arc::new(loaded), modified(certificate), modified(key))),
            checked: Mutex::new(Instant::now()),
        })
    }

    fn refresh(&self) {
        {
            let Ok(mut checked) = self.checked.lock() else {
                return;
            };
            if checked.elapsed() < RECHECK_EVERY {
                return;
            }
            *checked = Instant::now();
        }
        let stamps = (modified(&self.certificate), modified(&self.key));
        let unchanged = self
            .current
            .read()
            .map(|current| (current.1, current.2) == stamps)
            .unwrap_or(true);
        if unchanged {
            return;
        }
        match load(&self.certificate, &self.key) {
            Ok(loaded) => {
                if let Ok(mut current) = self.current.write() {
                    *current = (Arc::new(loaded), stamps.0, stamps.1);
                }
                tracing::info!(certificate = %self.certificate.display(), "TLS certificate reloaded");
            }
            // Half-written renewals fail here; the next check reads them again.
            Err(error) => {
                tracing::warn!(error = %error, "TLS certificate changed but cannot be loaded; keeping the one in service")
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        self.current.read().ok().map(|current| Arc::clone(&current.0))
    }
}

/// The listener's TLS configuration: HTTP/1.1 and HTTP/2, TLS 1.2 and 1.3.
pub fn server_config(certificate: &Path, key: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let resolver = Arc::new(ReloadingCertificate::new(certificate, key)?);
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The client configuration `cairn healthcheck` reaches its own listener with, on
/// loopback: it accepts whichever certificate the listener presents (checking the
/// handshake's signatures with it). A probe sends no credential and reads only
/// readiness, so what it must not do is depend on the certificate files: mid-renewal
/// they may hold a pair the server rightly keeps serving the old one over, or a file
/// that is not a certificate yet.
pub fn loopback_client() -> anyhow::Result<rustls::ClientConfig> {
    let verifier = Arc::new(AnyCertificate { provider: provider() });
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            certificate,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            certificate,
            signature,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
