//! Who is asking, and for which (tenant, user) scope.
//!
//! A [`Scope`] has private fields and exactly one constructor, [`Principal::scope_for`].
//! A [`Principal`] is created only by [`Principal::from_verified_credential`], which the
//! workspace `clippy.toml` forbids everywhere except the server's authentication module
//! (and test fixtures). Store methods take `&Scope` first, so a query without a tenant
//! filter cannot be written without going through authentication.

use crate::error::ErrorCode;
use crate::error::{Error, Result};
use std::fmt;

/// 1–128 characters of `[A-Za-z0-9._:@-]`, and not `.` or `..`: those are dot segments
/// of a URL path, which clients remove before a request is sent, so a user with such an
/// id could never be addressed (not read, not erased).
fn valid_identifier(value: &str) -> bool {
    (1..=128).contains(&value.len())
        && value != "."
        && value != ".."
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

macro_rules! identifier {
    ($name:ident, $field:literal) => {
        #[doc = concat!("A validated ", $field, " identifier: 1–128 chars of `[A-Za-z0-9._:@-]`.")]
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn parse(value: &str) -> Result<Self> {
                if valid_identifier(value) {
                    Ok(Self(value.to_owned()))
                } else {
                    Err(Error::invalid(
                        $field,
                        "must be 1-128 characters of letters, digits and . _ : @ - (not . or ..)",
                    ))
                }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

identifier!(TenantId, "tenant");
identifier!(UserId, "user");

/// One permission a credential may carry (`memory:read`, `memory:write`,
/// `memory:review`, `memory:admin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permission {
    Read,
    Write,
    /// Deciding on held outcomes (approve, reject) and reading the review queues.
    Review,
    Admin,
}

impl Permission {
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "memory:read",
            Permission::Write => "memory:write",
            Permission::Review => "memory:review",
            Permission::Admin => "memory:admin",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "memory:read" => Some(Permission::Read),
            "memory:write" => Some(Permission::Write),
            "memory:review" => Some(Permission::Review),
            "memory:admin" => Some(Permission::Admin),
            _ => None,
        }
    }
}

/// An authenticated caller: the token subject, its tenant, its optional user binding and
/// its permissions.
#[derive(Clone, Debug)]
pub struct Principal {
    subject: String,
    tenant: TenantId,
    bound_user: Option<UserId>,
    permissions: Vec<Permission>,
}

impl Principal {
    /// Builds a principal from a credential that has already been verified.
    ///
    /// Only the authentication layer may call this (enforced by `clippy.toml`): every
    /// [`Scope`] descends from a principal, so this is the single door into storage.
    pub fn from_verified_credential(
        subject: String,
        tenant: TenantId,
        bound_user: Option<UserId>,
        permissions: Vec<Permission>,
    ) -> Self {
        Principal {
            subject,
            tenant,
            bound_user,
            permissions,
        }
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn bound_user(&self) -> Option<&UserId> {
        self.bound_user.as_ref()
    }

    /// `memory:admin` implies read, write and review.
    pub fn has(&self, permission: Permission) -> bool {
        self.permissions
            .iter()
            .any(|held| *held == permission || *held == Permission::Admin)
    }

    /// The scope of `user` inside this principal's tenant, if the principal holds
    /// `permission` and is not bound to a different user.
    pub fn scope_for(&self, user: &str, permission: Permission) -> Result<Scope> {
        let user = UserId::parse(user)?;
        if !self.has(permission) {
            return Err(Error::Forbidden {
                code: ErrorCode::InsufficientScope,
                message: format!("this operation needs the {} scope", permission.as_str()),
            });
        }
        if let Some(bound) = &self.bound_user
            && *bound != user
        {
            return Err(Error::Forbidden {
                code: ErrorCode::UserMismatch,
                message: "this token is bound to a different user".to_owned(),
            });
        }
        Ok(Scope {
            tenant: self.tenant.clone(),
            user,
            subject: self.subject.clone(),
        })
    }
}

impl Principal {
    /// The whole tenant, for the admin reads that span its users (the user list): only
    /// an admin credential that is not bound to one user gets it.
    pub fn tenant_scope(&self) -> Result<TenantScope> {
        self.tenant_scope_for(Permission::Admin)
    }

    /// The whole tenant for a read that needs `permission` (the tenant's review queue
    /// needs `memory:review`), for a credential bound to no user.
    pub fn tenant_scope_for(&self, permission: Permission) -> Result<TenantScope> {
        if !self.has(permission) {
            return Err(Error::Forbidden {
                code: ErrorCode::InsufficientScope,
                message: format!("this operation needs the {} scope", permission.as_str()),
            });
        }
        if self.bound_user.is_some() {
            return Err(Error::Forbidden {
                code: ErrorCode::UserMismatch,
                message: "this token is bound to one user and cannot act on the whole tenant".to_owned(),
            });
        }
        Ok(TenantScope {
            tenant: self.tenant.clone(),
            subject: self.subject.clone(),
        })
    }
}

/// A tenant as a whole, and the subject acting on it. Only [`Principal::tenant_scope_for`]
/// creates one, so a read across a tenant's users is as tied to authentication as any
/// other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantScope {
    tenant: TenantId,
    subject: String,
}

impl TenantScope {
    /// The tenant of `scope`, for counting its review queue (metrics of queue depth after
    /// a review is held or decided in the scope). It reads no record of another user;
    /// `clippy.toml` allows it only where the review queue is counted.
    pub fn counting_reviews_of(scope: &Scope) -> Self {
        TenantScope {
            tenant: scope.tenant.clone(),
            subject: scope.subject.clone(),
        }
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn subject(&self) -> &str {
        &self.subject
    }
}

/// The (tenant, user) pair every record belongs to, plus the subject acting on it (for
/// the audit trail). Only [`Principal::scope_for`] creates one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    tenant: TenantId,
    user: UserId,
    subject: String,
}

impl Scope {
    /// The scope a stored record was written in (a consolidation job being handed
    /// out, a cluster commit journal being recovered). The record was written under a
    /// scope from [`Principal::scope_for`], so this only restores one; `clippy.toml`
    /// allows it in store backends alone.
    pub fn of_stored_record(tenant: TenantId, user: UserId, subject: String) -> Self {
        Scope {
            tenant,
            user,
            subject,
        }
    }

    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    pub fn user(&self) -> &UserId {
        &self.user
    }

    /// The authenticated subject acting in this scope.
    pub fn subject(&self) -> &str {
        &self.subject
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)]
    fn principal(bound: Option<&str>, permissions: Vec<Permission>) -> Principal {
        Principal::from_verified_credential(
            "svc".into(),
            TenantId::parse("acme").expect("valid tenant"),
            bound.map(|user| UserId::parse(user).expect("valid user")),
            permissions,
        )
    }

    #[test]
    fn identifiers_reject_bad_characters_and_lengths() {
        assert!(UserId::parse("alice@example.com").is_ok());
        assert!(UserId::parse("").is_err());
        assert!(UserId::parse("a b").is_err());
        assert!(UserId::parse("../etc").is_err());
        assert!(UserId::parse(&"x".repeat(129)).is_err());
        assert!(UserId::parse(&"x".repeat(128)).is_ok());
        // Dot segments, which clients drop from a URL path: no user could be addressed.
        for dots in [".", ".."] {
            assert!(UserId::parse(dots).is_err(), "{dots}");
            assert!(TenantId::parse(dots).is_err(), "{dots}");
        }
        assert!(UserId::parse("...").is_ok() && UserId::parse(".a").is_ok());
    }

    #[test]
    fn scope_requires_permission_and_matching_binding() {
        let reader = principal(None, vec![Permission::Read]);
        assert!(reader.scope_for("u1", Permission::Read).is_ok());
        let denied = reader.scope_for("u1", Permission::Write);
        assert!(matches!(
            denied,
            Err(Error::Forbidden {
                code: ErrorCode::InsufficientScope,
                ..
            })
        ));

        let bound = principal(Some("u1"), vec![Permission::Write, Permission::Read]);
        assert_eq!(
            bound
                .scope_for("u1", Permission::Read)
                .expect("own user")
                .user()
                .as_str(),
            "u1"
        );
        let other = bound.scope_for("u2", Permission::Read);
        assert!(matches!(
            other,
            Err(Error::Forbidden {
                code: ErrorCode::UserMismatch,
                ..
            })
        ));

        let admin = principal(None, vec![Permission::Admin]);
        assert!(admin.scope_for("u9", Permission::Write).is_ok());
    }
}
