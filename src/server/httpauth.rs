//! Who asks on the HTTP port (SPEC §18): whenever the default user needs a password, the ACL's
//! user and password in HTTP basic credentials, checked as AUTH checks them; otherwise the
//! default user, as a Redis connection that never sent AUTH. What the user's key patterns allow
//! is what it is shown (`/metrics` names namespaces and semaphores: issue 40, item 2).

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION};

use super::acl::{Acl, User};

/// The `WWW-Authenticate` challenge of an answer 401: basic credentials, for this realm.
pub const CHALLENGE: &str = "Basic realm=\"permitd\"";

/// The user a request's headers log in as; `None`: no credentials, or wrong ones (answer 401
/// with [`CHALLENGE`]).
pub fn user(acl: &Acl, headers: &HeaderMap) -> Option<Arc<User>> {
    if acl.default_is_open() {
        return acl.get("default");
    }
    let (name, pass) = credentials(headers.get(AUTHORIZATION)?)?;
    // `curl -u :pw` names no user: the default one, as `AUTH pw` does.
    let name = if name.is_empty() { "default" } else { &name };
    acl.login(name, &pass)
}

/// The user name and password of an `Authorization: Basic` header.
fn credentials(header: &HeaderValue) -> Option<(String, Vec<u8>)> {
    let (scheme, encoded) = header.to_str().ok()?.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = STANDARD.decode(encoded.trim()).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let name = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((name, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn basic_credentials_log_in_as_auth_does() {
        let acl = Acl::new(Some("pw".into()), None).unwrap();
        acl.setuser(
            "scraper",
            &["on".into(), ">s:cret".into(), "~team-a:*".into()],
        )
        .unwrap();
        let as_user = |auth: &str| user(&acl, &headers(auth)).map(|u| u.name.clone());
        // default:pw, :pw, scraper:s:cret (a password may hold a colon).
        assert_eq!(as_user("Basic ZGVmYXVsdDpwdw=="), Some("default".into()));
        assert_eq!(as_user("basic OnB3"), Some("default".into()));
        assert_eq!(
            as_user("Basic c2NyYXBlcjpzOmNyZXQ="),
            Some("scraper".into())
        );
        // default:wrong, no colon, not base64, another scheme, none at all.
        for bad in [
            "Basic ZGVmYXVsdDp3cm9uZw==",
            "Basic cHc=",
            "Basic !!",
            "Bearer pw",
        ] {
            assert_eq!(as_user(bad), None, "{bad}");
        }
        assert!(user(&acl, &HeaderMap::new()).is_none());
        let open = Acl::new(None, None).unwrap();
        assert!(user(&open, &HeaderMap::new()).is_some_and(|u| u.sees_all()));
    }
}
