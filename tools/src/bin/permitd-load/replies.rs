//! Reading replies on the hot path: each is classified from the reader's tokens over the
//! received bytes, with no tree built and nothing allocated, so the client costs the server it
//! measures as little CPU as it can (both share the machine's cores). The tool speaks RESP2.

use permitd_client::resp::{Reader, Token, Value};

use crate::args::{BoxError, Result};

/// How an acquire ended, by either target.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Acquired,
    Unavailable,
    TimedOut,
}

fn server_error(reply: &[u8], what: &str) -> BoxError {
    match Value::parse(reply) {
        Ok((Value::Error(e), _)) => format!("{what}: -{e}").into(),
        Ok((other, _)) => format!("{what}: unexpected reply {other:?}").into(),
        Err(e) => format!("{what}: {e}").into(),
    }
}

/// permitd's acquire result: a map whose `outcome` names what happened.
pub fn permitd_outcome(reply: &[u8]) -> Result<Outcome> {
    let mut r = Reader::new(reply);
    if let Ok(Token::Array(Some(n))) = r.token() {
        for _ in 0..n / 2 {
            let key = r.token()?;
            if matches!(key, Token::Bulk(Some(b"outcome"))) {
                return match r.token()? {
                    Token::Bulk(Some(b"ACQUIRE_OUTCOME_ACQUIRED")) => Ok(Outcome::Acquired),
                    Token::Bulk(Some(b"ACQUIRE_OUTCOME_UNAVAILABLE")) => Ok(Outcome::Unavailable),
                    Token::Bulk(Some(b"ACQUIRE_OUTCOME_TIMED_OUT")) => Ok(Outcome::TimedOut),
                    _ => Err(server_error(reply, "SEM.ACQUIRE: unknown outcome")),
                };
            }
            r.skip_items(key)?;
            r.skip()?;
        }
    }
    Err(server_error(reply, "SEM.ACQUIRE"))
}

/// EXEC's array of acquire results: acquired when every one is (else the first other outcome).
pub fn exec_outcome(reply: &[u8]) -> Result<Outcome> {
    let mut r = Reader::new(reply);
    let Ok(Token::Array(Some(n))) = r.token() else {
        return Err(server_error(reply, "EXEC"));
    };
    let mut all = Outcome::Acquired;
    let mut rest = &reply[r.position()..];
    for _ in 0..n {
        let len = permitd_client::resp::reply_len(rest).map_err(|e| format!("EXEC: {e}"))?;
        let o = permitd_outcome(&rest[..len])?;
        if all == Outcome::Acquired {
            all = o;
        }
        rest = &rest[len..];
    }
    Ok(all)
}

/// A simple-string reply `want` (`+OK`, `+QUEUED`).
pub fn simple(reply: &[u8], want: &[u8]) -> Result<()> {
    match Reader::new(reply).token() {
        Ok(Token::Simple(s)) if s == want => Ok(()),
        _ => Err(server_error(reply, "MULTI")),
    }
}

/// permitd's release result: the semaphore map.
pub fn permitd_released(reply: &[u8]) -> Result<()> {
    match Reader::new(reply).token() {
        Ok(Token::Array(Some(_))) => Ok(()),
        _ => Err(server_error(reply, "SEM.RELEASE")),
    }
}

/// The first element of an array reply: acquire.lua's and release.lua's `{1|0, held}`.
fn first_of_array<'a>(reply: &'a [u8]) -> Option<Token<'a>> {
    let mut r = Reader::new(reply);
    match r.token() {
        Ok(Token::Array(Some(n))) if n > 0 => r.token().ok(),
        _ => None,
    }
}

/// acquire.lua's `{1|0, held}`.
pub fn lua_outcome(reply: &[u8]) -> Result<Outcome> {
    match first_of_array(reply) {
        Some(Token::Int(1)) => Ok(Outcome::Acquired),
        Some(Token::Int(0)) => Ok(Outcome::Unavailable),
        _ => Err(server_error(reply, "EVALSHA acquire.lua")),
    }
}

/// release.lua's `{1|0, held}`.
pub fn lua_released(reply: &[u8]) -> Result<()> {
    match first_of_array(reply) {
        Some(Token::Int(_)) => Ok(()),
        _ => Err(server_error(reply, "EVALSHA release.lua")),
    }
}

pub fn pong(reply: &[u8]) -> Result<()> {
    match Reader::new(reply).token() {
        Ok(Token::Simple(b"PONG") | Token::Bulk(Some(b"PONG"))) => Ok(()),
        _ => Err(server_error(reply, "PING")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_permitd_outcomes() {
        let acquired = b"*6\r\n$7\r\noutcome\r\n$24\r\nACQUIRE_OUTCOME_ACQUIRED\r\n$9\r\nsemaphore\r\n*0\r\n$13\r\nfencing_token\r\n:7\r\n";
        assert_eq!(permitd_outcome(acquired).unwrap(), Outcome::Acquired);
        let unavailable =
            b"*4\r\n$9\r\nsemaphore\r\n*0\r\n$7\r\noutcome\r\n$27\r\nACQUIRE_OUTCOME_UNAVAILABLE\r\n";
        assert_eq!(permitd_outcome(unavailable).unwrap(), Outcome::Unavailable);
        let err = b"-NOTFOUND lease not found\r\n";
        let e = permitd_outcome(err).unwrap_err().to_string();
        assert!(e.contains("NOTFOUND lease not found"), "{e}");
    }

    #[test]
    fn classifies_lua_outcomes() {
        let yes = b"*2\r\n:1\r\n:3\r\n";
        assert_eq!(lua_outcome(yes).unwrap(), Outcome::Acquired);
        let no = b"*2\r\n:0\r\n:3\r\n";
        assert_eq!(lua_outcome(no).unwrap(), Outcome::Unavailable);
        assert!(lua_released(no).is_ok());
    }
}
