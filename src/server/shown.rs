//! A command's words as MONITOR and SLOWLOG show them: secrets replaced. A lease id is a
//! capability (SPEC §1), so any word shaped like one is shown as the logs show it; passwords
//! as Redis 7 shows them (`redactClientCommandArgument`): AUTH's words, HELLO's AUTH user and
//! password, and every word of `ACL SETUSER` after the subcommand (its rules carry passwords,
//! and Redis hides the user name too). MONITOR and SLOWLOG both show commands through here.

use bytes::Bytes;

use crate::command::Cmd;
use crate::engine::types::LeaseId;

/// What a lease id is shown as (the engine's `Debug` form of one, which the logs print).
pub const LEASE: &str = "ls_<redacted>";

/// What a password is shown as (Redis's spelling).
pub const SECRET: &str = "(redacted)";

/// The words of `argv` (a `cmd`) as they may be shown.
pub fn shown(cmd: Cmd, argv: &[Bytes]) -> Vec<Bytes> {
    // HELLO's AUTH is followed by the user and the password.
    let hello_auth = (cmd == Cmd::Hello)
        .then(|| argv.iter().position(|a| a.eq_ignore_ascii_case(b"AUTH")))
        .flatten();
    argv.iter()
        .enumerate()
        .map(|(i, a)| {
            let secret = match cmd {
                Cmd::Auth => i > 0,
                Cmd::Hello => hello_auth.is_some_and(|at| i > at && i <= at + 2),
                Cmd::AclSetUser => i > 1,
                _ => false,
            };
            if secret {
                Bytes::from_static(SECRET.as_bytes())
            } else if LeaseId::parse(a).is_some() {
                Bytes::from_static(LEASE.as_bytes())
            } else {
                a.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<Bytes> {
        w.iter()
            .map(|s| Bytes::copy_from_slice(s.as_bytes()))
            .collect()
    }

    #[test]
    fn lease_ids_and_passwords_are_hidden_and_nothing_else() {
        let lease = "ls_0123456789abcdefghijABCDEFGH";
        assert_eq!(
            shown(
                Cmd::SemAcquire,
                &words(&["SEM.ACQUIRE", "ns", "s", lease, "1", "5"])
            ),
            words(&["SEM.ACQUIRE", "ns", "s", LEASE, "1", "5"])
        );
        // Not shaped like one (too short): shown as it is.
        assert_eq!(
            shown(Cmd::LeaseGet, &words(&["LEASE.GET", "ns", "ls_short"])),
            words(&["LEASE.GET", "ns", "ls_short"])
        );
        assert_eq!(
            shown(Cmd::Auth, &words(&["AUTH", "alice", "pw"])),
            words(&["AUTH", SECRET, SECRET])
        );
        assert_eq!(
            shown(
                Cmd::Hello,
                &words(&["HELLO", "3", "auth", "u", "p", "SETNAME", "n"])
            ),
            words(&["HELLO", "3", "auth", SECRET, SECRET, "SETNAME", "n"])
        );
        assert_eq!(
            shown(
                Cmd::AclSetUser,
                &words(&["ACL", "SETUSER", "alice", "on", ">pw"])
            ),
            words(&["ACL", "SETUSER", SECRET, SECRET, SECRET])
        );
    }
}
