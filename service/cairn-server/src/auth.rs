//! Bearer JWT verification (HS256 secret, RS256/ES256 public keys from PEM or JWKS) and
//! token minting. This module is the only place that turns a credential into a
//! [`Principal`], and so the only door to a [`cairn_core::Scope`].

use crate::config::Config;
use cairn_core::{Permission, Principal, TenantId, UserId};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, errors::ErrorKind};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The claims Cairn reads and writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub tenant: String,
    /// Space-separated, OAuth style: `"memory:read memory:write"`.
    pub scope: String,
    pub exp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// One audience or several (RFC 7519 allows both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Set on a console login ticket (`ui-login`), which is never a bearer token: it is
    /// exchanged once, at `POST /ui/session`, for a token of `session_seconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

/// The `purpose` of a console login ticket.
pub const LOGIN_PURPOSE: &str = "ui-login";
/// How long a login ticket may be redeemed.
pub const LOGIN_TICKET_SECONDS: i64 = 120;
/// The longest console session a ticket may ask for.
pub const MAX_SESSION_SECONDS: i64 = 12 * 3600;

/// The `aud` claim: a string or an array of strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

/// Why a credential was refused. Every variant is a 401.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("an Authorization: Bearer token is required")]
    Missing,
    #[error("the token has expired")]
    Expired,
    #[error("the token is invalid: {0}")]
    Invalid(String),
}

impl AuthError {
    pub fn code(&self) -> cairn_core::ErrorCode {
        use cairn_core::ErrorCode;
        match self {
            AuthError::Missing => ErrorCode::MissingToken,
            AuthError::Expired => ErrorCode::TokenExpired,
            AuthError::Invalid(_) => ErrorCode::InvalidToken,
        }
    }
}

#[derive(Clone)]
struct VerificationKey {
    key: DecodingKey,
    algorithm: Algorithm,
    key_id: Option<String>,
}

/// Verifies bearer tokens against the configured keys.
pub struct Verifier {
    keys: Vec<VerificationKey>,
    /// Accepted audiences (any one in the token's `aud`); empty: not checked.
    audiences: Vec<String>,
    /// Accepted issuers; empty: not checked.
    issuers: Vec<String>,
    leeway_seconds: u64,
    /// The longest lifetime (`exp - iat`) accepted; 0: no limit.
    max_ttl_seconds: u64,
    /// Keys read from a JWKS URL, when one is configured.
    remote: Option<std::sync::Arc<RemoteKeys>>,
}

/// How many refresh intervals (`CAIRN_JWT_JWKS_REFRESH_SECONDS`, 10 minutes by default)
/// fetched JWKS keys are trusted when fetching them again keeps failing (an hour by
/// default): past it, tokens signed with them are refused until a fetch succeeds.
pub const JWKS_TRUSTED_INTERVALS: u32 = 6;
/// The shortest interval between two fetches, so that forged key ids cannot make the
/// service hammer the identity provider.
const JWKS_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
/// The largest JWKS document read; a key set is a few kilobytes.
const JWKS_MAX_BYTES: usize = 1024 * 1024;

/// A JWKS served over HTTP(S): cached and fetched again when it is older than its
/// refresh interval (in the background: requests go on with the cached keys meanwhile)
/// or when a token names a key id it does not hold. At most one fetch runs at a time, and a request waits for a fetch only when it
/// holds no key for its token; requests that waited share the fetch.
struct RemoteKeys {
    url: String,
    client: reqwest::Client,
    /// How long fetched keys are used before they are fetched again.
    refresh_after: std::time::Duration,
    keys: std::sync::RwLock<std::sync::Arc<Vec<VerificationKey>>>,
    /// When the last fetch was tried.
    tried: std::sync::Mutex<Option<std::time::Instant>>,
    /// When keys were last fetched successfully.
    fetched: std::sync::Mutex<Option<std::time::Instant>>,
    /// Fetches finished, successful or not: a request that waited for one does not make
    /// another.
    attempts: std::sync::atomic::AtomicU64,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
    /// Whether a background refresh is under way.
    refreshing: std::sync::atomic::AtomicBool,
}

impl RemoteKeys {
    /// The keys still trusted: fetched within [`JWKS_TRUSTED_INTERVALS`] refresh intervals.
    fn usable(&self) -> std::sync::Arc<Vec<VerificationKey>> {
        let trust = self.refresh_after.saturating_mul(JWKS_TRUSTED_INTERVALS);
        let trusted = Self::elapsed(&self.fetched).is_some_and(|age| age <= trust);
        if !trusted {
            return std::sync::Arc::default();
        }
        self.keys
            .read()
            .map(|keys| std::sync::Arc::clone(&keys))
            .unwrap_or_default()
    }

    fn elapsed(slot: &std::sync::Mutex<Option<std::time::Instant>>) -> Option<std::time::Duration> {
        slot.lock().ok().and_then(|at| at.map(|at| at.elapsed()))
    }

    /// Whether a fetch may start now ([`JWKS_MIN_INTERVAL`] after the last one).
    fn may_fetch(&self) -> bool {
        Self::elapsed(&self.tried).is_none_or(|since| since >= JWKS_MIN_INTERVAL)
    }

    /// Makes sure a token with this key id can be verified, as far as fetching can: a
    /// token whose key is held goes on at once (a stale set is refreshed in the
    /// background); one whose key is not held waits for one fetch, shared with every
    /// request waiting meanwhile.
    async fn refresh_for(self: &std::sync::Arc<Self>, kid: Option<&str>) -> Result<(), KeyError> {
        let usable = self.usable();
        let held = match kid {
            Some(kid) => usable.iter().any(|key| key.key_id.as_deref() == Some(kid)),
            None => !usable.is_empty(),
        };
        if held {
            if Self::elapsed(&self.fetched).is_none_or(|age| age > self.refresh_after) {
                self.refresh_in_background();
            }
            return Ok(());
        }
        self.fetch_shared().await
    }

    /// Starts a fetch on its own task, unless one is under way or was tried just now.
    fn refresh_in_background(self: &std::sync::Arc<Self>) {
        use std::sync::atomic::Ordering;
        if !self.may_fetch() || self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let keys = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = keys.fetch_shared().await {
                tracing::warn!(error = %error, "refreshing the JWKS failed; the cached keys stay in use");
            }
            keys.refreshing.store(false, Ordering::Release);
        });
    }

    /// One fetch, unless another finished while this waited for its turn or one was
    /// tried within [`JWKS_MIN_INTERVAL`].
    async fn fetch_shared(&self) -> Result<(), KeyError> {
        use std::sync::atomic::Ordering;
        let seen = self.attempts.load(Ordering::Acquire);
        let _one = self.fetching.lock().await;
        if self.attempts.load(Ordering::Acquire) != seen || !self.may_fetch() {
            return Ok(());
        }
        let fetched = self.fetch_locked().await;
        self.attempts.fetch_add(1, Ordering::AcqRel);
        fetched.map(|_| ())
    }

    async fn fetch(&self) -> Result<usize, KeyError> {
        let _one = self.fetching.lock().await;
        let fetched = self.fetch_locked().await;
        self.attempts.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        fetched
    }

    /// Fetches the key set; the caller holds `fetching`.
    async fn fetch_locked(&self) -> Result<usize, KeyError> {
        if let Ok(mut tried) = self.tried.lock() {
            *tried = Some(std::time::Instant::now());
        }
        let key_error = |message: String| KeyError {
            key: "CAIRN_JWT_JWKS_URL",
            message,
        };
        let mut response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|error| key_error(format!("cannot fetch {}: {error}", self.url)))?;
        if !response.status().is_success() {
            return Err(key_error(format!("{} answered {}", self.url, response.status())));
        }
        let too_large = || key_error(format!("{} answered more than {JWKS_MAX_BYTES} bytes", self.url));
        if response
            .content_length()
            .is_some_and(|length| length > JWKS_MAX_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| key_error(format!("cannot read {}: {error}", self.url)))?
        {
            if body.len() + chunk.len() > JWKS_MAX_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(body).map_err(|_| key_error(format!("{} is not UTF-8", self.url)))?;
        let keys = jwks_keys(&text).map_err(|error| KeyError {
            key: "CAIRN_JWT_JWKS_URL",
            message: error.message,
        })?;
        let count = keys.len();
        if let Ok(mut slot) = self.keys.write() {
            *slot = std::sync::Arc::new(keys);
        }
        if let Ok(mut fetched) = self.fetched.lock() {
            *fetched = Some(std::time::Instant::now());
        }
        Ok(count)
    }
}

/// The JWKS client: a short timeout, and redirects followed only within the URL's own
/// origin (a key set served from elsewhere is not the identity provider's).
fn jwks_client() -> reqwest::Result<reqwest::Client> {
    let same_origin = reqwest::redirect::Policy::custom(|attempt| {
        let origin = attempt.previous().first().map(reqwest::Url::origin);
        if attempt.previous().len() > 5 || origin.as_ref() != Some(&attempt.url().origin()) {
            attempt.stop()
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .redirect(same_origin)
        .build()
}

fn decode_header(token: &str) -> Result<jsonwebtoken::Header, AuthError> {
    jsonwebtoken::decode_header(token)
        .map_err(|error| AuthError::Invalid(format!("malformed header ({error})")))
}

/// The entries of a comma-separated list setting.
pub fn list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A problem with the configured keys, reported at start.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct KeyError {
    pub key: &'static str,
    pub message: String,
}

impl Verifier {
    /// Builds a verifier from the configuration; `secret` overrides the configured
    /// HS256 secret (development mode passes its generated one).
    pub fn from_config(config: &Config, secret: Option<&str>) -> Result<Self, KeyError> {
        let mut keys = Vec::new();
        let secrets = match secret {
            Some(secret) => vec![secret],
            None => config.jwt_secrets(),
        };
        // Every configured secret verifies (rotation: add the new one, move callers
        // over, remove the old one).
        for secret in secrets {
            keys.push(VerificationKey {
                key: DecodingKey::from_secret(secret.as_bytes()),
                algorithm: Algorithm::HS256,
                key_id: None,
            });
        }
        if let Some(path) = &config.jwt_public_keys {
            keys.extend(load_public_keys(path)?);
        }
        let remote = match &config.jwt_jwks_url {
            Some(url) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(KeyError {
                        key: "CAIRN_JWT_JWKS_URL",
                        message: format!("{url:?} is not an http(s) URL"),
                    });
                }
                if url.starts_with("http://") && !config.dev {
                    tracing::warn!(
                        url = %url,
                        "CAIRN_JWT_JWKS_URL is plain http: anyone on the path can replace the keys that admit callers; use https"
                    );
                }
                let client = jwks_client().map_err(|error| KeyError {
                    key: "CAIRN_JWT_JWKS_URL",
                    message: error.to_string(),
                })?;
                Some(std::sync::Arc::new(RemoteKeys {
                    url: url.clone(),
                    client,
                    refresh_after: std::time::Duration::from_secs(config.jwt_jwks_refresh_seconds),
                    keys: std::sync::RwLock::default(),
                    tried: std::sync::Mutex::default(),
                    fetched: std::sync::Mutex::default(),
                    attempts: std::sync::atomic::AtomicU64::new(0),
                    fetching: tokio::sync::Mutex::default(),
                    refreshing: std::sync::atomic::AtomicBool::new(false),
                }))
            }
            None => None,
        };
        if keys.is_empty() && remote.is_none() {
            return Err(KeyError {
                key: "CAIRN_JWT_SECRET",
                message: "no verification key is configured: set CAIRN_JWT_SECRET, CAIRN_JWT_PUBLIC_KEYS or CAIRN_JWT_JWKS_URL (or run in dev mode)".into(),
            });
        }
        Ok(Verifier {
            keys,
            audiences: list(config.jwt_audience.as_deref()),
            issuers: list(config.jwt_issuer.as_deref()),
            leeway_seconds: config.jwt_leeway_seconds,
            max_ttl_seconds: config.jwt_max_ttl_seconds,
            remote,
        })
    }

    /// Fetches the JWKS now, when a URL is configured; returns how many keys it holds.
    pub async fn fetch_remote_keys(&self) -> Result<Option<usize>, KeyError> {
        match &self.remote {
            Some(remote) => remote.fetch().await.map(Some),
            None => Ok(None),
        }
    }

    /// [`Verifier::verify`], fetching the JWKS first when it holds no key for the token
    /// (at most once per [`JWKS_MIN_INTERVAL`], shared by the requests waiting), and in
    /// the background when it is stale. HS256 tokens never wait on the JWKS.
    pub async fn verify_fresh(&self, token: &str) -> Result<Principal, AuthError> {
        let header = decode_header(token)?;
        if let Some(remote) = &self.remote
            && header.alg != Algorithm::HS256
            && let Err(error) = remote.refresh_for(header.kid.as_deref()).await
        {
            tracing::warn!(error = %error, "fetching the JWKS failed; the cached keys stay in use");
        }
        self.verify_with_header(token, &header)
    }

    /// Verifies a compact JWT and returns the principal it proves, with the keys held now.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        self.verify_with_header(token, &decode_header(token)?)
    }

    fn verify_with_header(&self, token: &str, header: &jsonwebtoken::Header) -> Result<Principal, AuthError> {
        let claims = self.claims_with_header(token, header)?;
        if claims.purpose.is_some() {
            return Err(AuthError::Invalid("a login ticket is not a bearer token".into()));
        }
        principal_from_claims(claims)
    }

    /// Until when (Unix seconds) a token of these claims verifies: its expiry plus the
    /// clock leeway allowed on it.
    pub fn accepted_until(&self, claims: &Claims) -> i64 {
        claims
            .exp
            .saturating_add(i64::try_from(self.leeway_seconds).unwrap_or(i64::MAX))
    }

    /// The claims of a console login ticket, checked like any token and for its purpose,
    /// its id and its short life. The caller makes sure each is redeemed once.
    pub fn login_ticket(&self, ticket: &str) -> Result<Claims, AuthError> {
        let claims = self.claims_with_header(ticket, &decode_header(ticket)?)?;
        if claims.purpose.as_deref() != Some(LOGIN_PURPOSE) {
            return Err(AuthError::Invalid("not a login ticket".into()));
        }
        if claims.jti.as_deref().is_none_or(str::is_empty) {
            return Err(AuthError::Invalid("a login ticket needs a jti".into()));
        }
        let leeway = i64::try_from(self.leeway_seconds).unwrap_or(i64::MAX);
        if claims.exp
            > chrono::Utc::now()
                .timestamp()
                .saturating_add(LOGIN_TICKET_SECONDS + leeway)
        {
            return Err(AuthError::Invalid(
                "a login ticket lives at most 2 minutes".into(),
            ));
        }
        // The same checks as a bearer token's, before anything is minted from it.
        principal_from_claims(Claims {
            purpose: None,
            ..claims.clone()
        })?;
        Ok(claims)
    }

    fn claims_with_header(&self, token: &str, header: &jsonwebtoken::Header) -> Result<Claims, AuthError> {
        let remote = self
            .remote
            .as_ref()
            .map(|remote| remote.usable())
            .unwrap_or_default();
        let candidates = self.keys.iter().chain(remote.iter()).filter(|candidate| {
            candidate.algorithm == header.alg
                && match (&header.kid, &candidate.key_id) {
                    (Some(wanted), Some(have)) => wanted == have,
                    _ => true,
                }
        });
        let mut last_error =
            AuthError::Invalid(format!("no configured key accepts algorithm {:?}", header.alg));
        for candidate in candidates {
            let mut validation = Validation::new(candidate.algorithm);
            validation.leeway = self.leeway_seconds;
            validation.validate_nbf = true;
            // A configured audience or issuer must be present, not merely match when present.
            let mut required = vec!["exp", "sub"];
            if self.audiences.is_empty() {
                validation.validate_aud = false;
            } else {
                validation.set_audience(&self.audiences);
                required.push("aud");
            }
            if !self.issuers.is_empty() {
                validation.set_issuer(&self.issuers);
                required.push("iss");
            }
            if self.max_ttl_seconds > 0 {
                required.push("iat");
            }
            validation.set_required_spec_claims(&required);
            match jsonwebtoken::decode::<Claims>(token, &candidate.key, &validation) {
                Ok(data) => {
                    if data.claims.purpose.is_none() {
                        self.check_lifetime(&data.claims)?;
                    }
                    return Ok(data.claims);
                }
                Err(error) => {
                    last_error = match error.kind() {
                        ErrorKind::ExpiredSignature => return Err(AuthError::Expired),
                        ErrorKind::InvalidSignature => AuthError::Invalid("bad signature".into()),
                        ErrorKind::InvalidAudience => {
                            return Err(AuthError::Invalid("wrong audience".into()));
                        }
                        ErrorKind::InvalidIssuer => return Err(AuthError::Invalid("wrong issuer".into())),
                        ErrorKind::ImmatureSignature => {
                            return Err(AuthError::Invalid("not valid yet".into()));
                        }
                        ErrorKind::MissingRequiredClaim(claim) => {
                            return Err(AuthError::Invalid(format!("missing claim {claim}")));
                        }
                        ErrorKind::Json(_) => return Err(AuthError::Invalid("claims are malformed".into())),
                        _ => AuthError::Invalid(error.to_string()),
                    };
                }
            }
        }
        Err(last_error)
    }
}

impl Verifier {
    /// Refuses a token whose lifetime (`exp - iat`) exceeds the configured maximum, or
    /// whose `iat` lies in the future.
    fn check_lifetime(&self, claims: &Claims) -> Result<(), AuthError> {
        if self.max_ttl_seconds == 0 {
            return Ok(());
        }
        let Some(issued) = claims.iat else {
            return Err(AuthError::Invalid("missing claim iat".into()));
        };
        let leeway = i64::try_from(self.leeway_seconds).unwrap_or(i64::MAX);
        if issued > chrono::Utc::now().timestamp().saturating_add(leeway) {
            return Err(AuthError::Invalid("issued in the future".into()));
        }
        let lifetime = claims.exp.saturating_sub(issued);
        if lifetime > i64::try_from(self.max_ttl_seconds).unwrap_or(i64::MAX) {
            return Err(AuthError::Invalid(format!(
                "lifetime of {lifetime} s exceeds the maximum of {} s",
                self.max_ttl_seconds
            )));
        }
        Ok(())
    }
}

/// The operator at the command line (`cairn export`, `cairn import`): whoever can run
/// the binary with the service's configuration and reach its store already holds every
/// tenant's data, so the command acts as an admin of the tenant it names, and its audit
/// events carry the subject `cli:<name>`.
#[allow(clippy::disallowed_methods)]
pub fn local_operator(tenant: &str, name: &str) -> anyhow::Result<Principal> {
    let tenant = TenantId::parse(tenant).map_err(|error| anyhow::anyhow!("--tenant: {error}"))?;
    Ok(Principal::from_verified_credential(
        format!("cli:{name}"),
        tenant,
        None,
        vec![Permission::Admin],
    ))
}

#[allow(clippy::disallowed_methods)]
fn principal_from_claims(claims: Claims) -> Result<Principal, AuthError> {
    if claims.sub.trim().is_empty() {
        return Err(AuthError::Invalid("empty sub".into()));
    }
    // The subject is written to logs and the audit trail: a control character (a line
    // break) could forge lines in a text log. No identity provider issues one.
    if claims.sub.chars().any(char::is_control) || claims.sub.len() > 256 {
        return Err(AuthError::Invalid(
            "sub: at most 256 bytes, without control characters".into(),
        ));
    }
    let tenant =
        TenantId::parse(&claims.tenant).map_err(|_| AuthError::Invalid("bad tenant claim".into()))?;
    let user = claims
        .user
        .as_deref()
        .map(UserId::parse)
        .transpose()
        .map_err(|_| AuthError::Invalid("bad user claim".into()))?;
    let permissions: Vec<Permission> = claims
        .scope
        .split_whitespace()
        .filter_map(Permission::parse)
        .collect();
    Ok(Principal::from_verified_credential(
        claims.sub,
        tenant,
        user,
        permissions,
    ))
}

fn load_public_keys(path: &Path) -> Result<Vec<VerificationKey>, KeyError> {
    let key_error = |message: String| KeyError {
        key: "CAIRN_JWT_PUBLIC_KEYS",
        message,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|error| key_error(format!("cannot read {}: {error}", path.display())))?;
    if text.trim_start().starts_with('{') {
        return jwks_keys(&text);
    }
    let mut keys = Vec::new();
    for block in pem_blocks(&text) {
        if let Ok(key) = DecodingKey::from_rsa_pem(block.as_bytes()) {
            keys.push(VerificationKey {
                key,
                algorithm: Algorithm::RS256,
                key_id: None,
            });
        } else if let Ok(key) = DecodingKey::from_ec_pem(block.as_bytes()) {
            keys.push(VerificationKey {
                key,
                algorithm: Algorithm::ES256,
                key_id: None,
            });
        } else {
            return Err(key_error(
                "a PEM block is neither an RSA nor an EC public key".into(),
            ));
        }
    }
    if keys.is_empty() {
        return Err(key_error("no PEM public key found".into()));
    }
    Ok(keys)
}

/// The RSA and EC keys of a JWKS document.
fn jwks_keys(text: &str) -> Result<Vec<VerificationKey>, KeyError> {
    let key_error = |message: String| KeyError {
        key: "CAIRN_JWT_PUBLIC_KEYS",
        message,
    };
    let set: JwkSet =
        serde_json::from_str(text).map_err(|error| key_error(format!("not a JWKS document: {error}")))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let algorithm = match &jwk.algorithm {
            jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
            jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
            _ => continue,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|error| key_error(format!("unusable JWK: {error}")))?;
        keys.push(VerificationKey {
            key,
            algorithm,
            key_id: jwk.common.key_id.clone(),
        });
    }
    if keys.is_empty() {
        return Err(key_error("the JWKS holds no RSA or EC key".into()));
    }
    Ok(keys)
}

/// Splits a file holding several PEM blocks into one string per block.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("-----BEGIN ") {
            current = Some(String::new());
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
        if line.starts_with("-----END ") {
            blocks.extend(current.take());
        }
    }
    blocks
}

/// What `cairn token mint` needs.
pub struct MintRequest {
    pub subject: String,
    pub tenant: String,
    pub scopes: Vec<String>,
    pub user: Option<String>,
    pub ttl_seconds: i64,
    pub audience: Option<String>,
    pub issuer: Option<String>,
}

/// Signs a token with an HS256 secret, or with an RS256/ES256 private key in PEM.
pub fn mint(
    request: &MintRequest,
    secret: Option<&str>,
    private_key_pem: Option<&[u8]>,
) -> anyhow::Result<String> {
    TenantId::parse(&request.tenant)
        .map_err(|_| anyhow::anyhow!("--tenant: must be 1-128 chars of [A-Za-z0-9._:@-], not . or .."))?;
    if let Some(user) = &request.user {
        UserId::parse(user)
            .map_err(|_| anyhow::anyhow!("--user: must be 1-128 chars of [A-Za-z0-9._:@-], not . or .."))?;
    }
    for scope in &request.scopes {
        if Permission::parse(scope).is_none() {
            anyhow::bail!(
                "--scope: unknown scope {scope:?}; expected memory:read, memory:write, memory:review or memory:admin"
            );
        }
    }
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub: request.subject.clone(),
        tenant: request.tenant.clone(),
        scope: request.scopes.join(" "),
        exp: now + request.ttl_seconds,
        iat: Some(now),
        nbf: None,
        aud: request.audience.clone().map(Audience::One),
        iss: request.issuer.clone(),
        user: request.user.clone(),
        purpose: None,
        session_seconds: None,
        jti: None,
    };
    sign(&claims, secret, private_key_pem)
}

/// A console login ticket for `request`: redeemable once, within two minutes, at
/// `POST /ui/session` for a token of `request.ttl_seconds` (at most 12 hours). It is
/// not itself a bearer token.
pub fn mint_login_ticket(
    request: &MintRequest,
    secret: Option<&str>,
    private_key_pem: Option<&[u8]>,
) -> anyhow::Result<String> {
    if request.ttl_seconds > MAX_SESSION_SECONDS {
        anyhow::bail!("--ttl: a console session lasts at most 12h");
    }
    // The checks of an ordinary token, on the same claims.
    mint(request, secret, private_key_pem)?;
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub: request.subject.clone(),
        tenant: request.tenant.clone(),
        scope: request.scopes.join(" "),
        exp: now + LOGIN_TICKET_SECONDS,
        iat: Some(now),
        nbf: None,
        aud: request.audience.clone().map(Audience::One),
        iss: request.issuer.clone(),
        user: request.user.clone(),
        purpose: Some(LOGIN_PURPOSE.to_owned()),
        session_seconds: Some(request.ttl_seconds),
        jti: Some(cairn_core::new_id("login")),
    };
    sign(&claims, secret, private_key_pem)
}

/// The console session token a redeemed login ticket stands for, signed with the
/// server's HS256 secret.
pub fn mint_session(ticket: &Claims, secret: &str) -> anyhow::Result<(String, i64)> {
    let now = chrono::Utc::now().timestamp();
    let seconds = ticket
        .session_seconds
        .unwrap_or(3600)
        .clamp(60, MAX_SESSION_SECONDS);
    let claims = Claims {
        exp: now + seconds,
        iat: Some(now),
        nbf: None,
        purpose: None,
        session_seconds: None,
        jti: None,
        ..ticket.clone()
    };
    Ok((sign(&claims, Some(secret), None)?, claims.exp))
}

fn sign(claims: &Claims, secret: Option<&str>, private_key_pem: Option<&[u8]>) -> anyhow::Result<String> {
    let (header, key) = match (private_key_pem, secret) {
        (Some(pem), _) => {
            if let Ok(key) = EncodingKey::from_rsa_pem(pem) {
                (Header::new(Algorithm::RS256), key)
            } else {
                let key = EncodingKey::from_ec_pem(pem).map_err(|error| {
                    anyhow::anyhow!("--private-key: neither an RSA nor an EC private key: {error}")
                })?;
                (Header::new(Algorithm::ES256), key)
            }
        }
        (None, Some(secret)) => (
            Header::new(Algorithm::HS256),
            EncodingKey::from_secret(secret.as_bytes()),
        ),
        (None, None) => anyhow::bail!("no signing key: set CAIRN_JWT_SECRET or pass --private-key"),
    };
    Ok(jsonwebtoken::encode(&header, claims, &key)?)
}

/// Parses `--ttl` values such as `90s`, `15m`, `1h`, `7d`.
pub fn parse_ttl(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: i64 = number
        .parse()
        .map_err(|_| anyhow::anyhow!("--ttl: expected a number with s, m, h or d"))?;
    let seconds = match unit {
        "" | "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        "d" => number * 86_400,
        _ => anyhow::bail!("--ttl: unknown unit {unit:?}; use s, m, h or d"),
    };
    if seconds <= 0 {
        anyhow::bail!("--ttl: must be positive");
    }
    Ok(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_secret(secret: &str) -> Config {
        Config {
            jwt_secret: Some(secret.into()),
            ..Config::default()
        }
    }

    #[test]
    fn a_login_ticket_is_redeemable_but_never_a_bearer_token() {
        let secret = "0123456789abcdef0123456789abcdef";
        let verifier = Verifier::from_config(&config_with_secret(secret), None).expect("verifier");
        let ticket = mint_login_ticket(&request(3600), Some(secret), None).expect("ticket");
        assert!(matches!(verifier.verify(&ticket), Err(AuthError::Invalid(_))));
        let claims = verifier.login_ticket(&ticket).expect("redeemable");
        assert_eq!(claims.session_seconds, Some(3600));
        let (session, expires) = mint_session(&claims, secret).expect("session");
        let principal = verifier.verify(&session).expect("a bearer token");
        assert_eq!(principal.bound_user().map(|user| user.as_str()), Some("u1"));
        assert!(principal.has(Permission::Read) && !principal.has(Permission::Write));
        assert!(expires - chrono::Utc::now().timestamp() > 3500);
        // An ordinary token is not a ticket, and a session longer than 12 h is refused.
        let token = mint(&request(60), Some(secret), None).expect("token");
        assert!(verifier.login_ticket(&token).is_err());
        assert!(mint_login_ticket(&request(13 * 3600), Some(secret), None).is_err());
    }

    fn request(ttl_seconds: i64) -> MintRequest {
        MintRequest {
            subject: "svc".into(),
            tenant: "acme".into(),
            scopes: vec!["memory:read".into()],
            user: Some("u1".into()),
            ttl_seconds,
            audience: None,
            issuer: None,
        }
    }

    #[test]
    fn minted_tokens_verify_and_tampering_fails() {
        let secret = "0123456789abcdef0123456789abcdef";
        let verifier = Verifier::from_config(&config_with_secret(secret), None).expect("verifier");
        let token = mint(&request(60), Some(secret), None).expect("mint");
        let principal = verifier.verify(&token).expect("valid");
        assert_eq!(principal.tenant().as_str(), "acme");
        assert_eq!(principal.bound_user().map(UserId::as_str), Some("u1"));
        assert!(principal.has(Permission::Read));
        assert!(!principal.has(Permission::Write));

        let other = mint(&request(60), Some("another-secret-another-secret-xx"), None).expect("mint");
        assert!(matches!(verifier.verify(&other), Err(AuthError::Invalid(_))));
        let expired = mint(&request(-3600), Some(secret), None).expect("mint");
        assert!(matches!(verifier.verify(&expired), Err(AuthError::Expired)));
        assert!(matches!(verifier.verify("not-a-jwt"), Err(AuthError::Invalid(_))));
    }

    #[test]
    fn ttl_parsing() {
        assert_eq!(parse_ttl("90s").expect("s"), 90);
        assert_eq!(parse_ttl("2h").expect("h"), 7200);
        assert_eq!(parse_ttl("1d").expect("d"), 86_400);
        assert!(parse_ttl("soon").is_err());
        assert!(parse_ttl("3w").is_err());
    }
}
