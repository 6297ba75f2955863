//! A connection's session: the client it registered as, who is logged in, the protocol it
//! speaks, and whether it is to close. The surface commands (surface.rs) work on it, and a
//! connection that moves to another shard thread carries it along.

use std::sync::Arc;

use bytes::Bytes;

use super::acl::{Acl, User};
use super::clients::{Client, Registration};
use crate::command::CommandSpec;
use crate::error::Error;
use crate::protocol::Proto;

/// See the module docs.
#[derive(Debug)]
pub struct Session {
    registration: Registration,
    proto: Proto,
    /// The logged-in user; `None` until AUTH when the default user has a password.
    user: Option<Arc<User>>,
    /// The ACL version `user` was read at.
    acl_version: u64,
    /// Close once the replies so far are written.
    pub close: bool,
}

impl Session {
    /// A new connection's session: RESP2, and logged in as the default user at once when it
    /// needs no password.
    pub fn new(acl: &Acl, registration: Registration) -> Session {
        // The version first: a change between the two reads then shows at the next command.
        let acl_version = acl.version();
        Session {
            registration,
            proto: Proto::Resp2,
            user: default_user(acl),
            acl_version,
            close: false,
        }
    }

    /// The connection's entry in the client registry.
    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// The registered client.
    pub fn client(&self) -> &Arc<Client> {
        self.registration.client()
    }

    /// The protocol replies are encoded in.
    pub fn proto(&self) -> Proto {
        self.proto
    }

    /// Switches the protocol (HELLO, RESET).
    pub fn set_proto(&mut self, p: Proto) {
        self.proto = p;
        self.client().set_proto(p);
    }

    /// Whether a user is logged in (the request parser is stricter before).
    pub fn is_authenticated(&self) -> bool {
        self.user.is_some()
    }

    /// The logged-in user as last read from the ACL.
    pub fn user(&self) -> Option<&Arc<User>> {
        self.user.as_ref()
    }

    /// The logged-in user, re-read when the ACL changed (a deleted user is logged out).
    pub fn current_user(&mut self, acl: &Acl) -> Option<&User> {
        let v = acl.version();
        if v != self.acl_version {
            self.acl_version = v;
            self.user = self.user.take().and_then(|u| acl.get(&u.name));
        }
        self.user.as_deref()
    }

    /// Logs in as `user` (the default user when left out) if `pass` is one of its passwords.
    pub fn auth(
        &mut self,
        acl: &Acl,
        user: Option<&Bytes>,
        pass: &Bytes,
        from_hello: bool,
    ) -> Result<(), Error> {
        if user.is_none() && !from_hello && acl.default_is_open() {
            return Err(Error::Err(
                "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into(),
            ));
        }
        let name = user.map_or("default".into(), |u| {
            String::from_utf8_lossy(u).into_owned()
        });
        let found = acl.login(&name, pass);
        let Some(found) = found else {
            return Err(Error::WrongPass(
                "invalid username-password pair or user is disabled.".into(),
            ));
        };
        self.user = Some(found);
        self.acl_version = acl.version();
        self.client().set_user(Bytes::from(name));
        Ok(())
    }

    /// RESET: RESP2, no name, and logged in as a new connection is.
    pub fn reset(&mut self, acl: &Acl) {
        self.set_proto(Proto::Resp2);
        self.client().set_name(Bytes::new());
        self.user = default_user(acl);
        self.client().set_user(Bytes::from_static(b"default"));
    }
}

/// The default user, when it needs no password.
fn default_user(acl: &Acl) -> Option<Arc<User>> {
    acl.get("default").filter(|u| u.is_open())
}

/// Whether `user` may run `spec` with these arguments (its namespace is the first key).
pub fn check_permissions(user: &User, spec: &CommandSpec, argv: &[Bytes]) -> Result<(), Error> {
    if !user.can_run(spec) {
        return Err(Error::NoPerm(format!(
            "User {} has no permissions to run the '{}' command",
            user.name, spec.name
        )));
    }
    if spec.first_key > 0 {
        if let Some(ns) = argv.get(spec.first_key as usize) {
            if !user.can_access(ns) {
                return Err(Error::NoPerm(format!(
                    "No permissions to access namespace '{}'",
                    String::from_utf8_lossy(&ns[..ns.len().min(128)])
                )));
            }
        }
    }
    Ok(())
}
