//! Peer authentication on the cluster port (SPEC §10, `--cluster-secret`): each side proves it
//! knows the cluster secret by an HMAC-SHA256 of both sides' fresh nonces, so the secret never
//! crosses the wire and a recorded handshake proves nothing on another connection.
//!
//! The dialing side says hello (its nonce and the node it means to reach), the listening side
//! answers with its nonce and its proof, the dialing side checks it and sends its own proof,
//! and the listening side accepts or refuses. The two proofs are labelled by side, so one side's
//! proof is never the other's. Without a secret (every peer on loopback) the key is empty: the
//! same exchange, which then only checks that both sides run without one.
//!
//! The hello opens with the dialing side's [`WIRE_VERSION`], and the listening side reads no
//! further when it is not its own: nodes that do not speak the same peer protocol refuse each
//! other, saying why, instead of failing on a frame that does not decode (mixing versions, in
//! a rolling upgrade say, is not supported). That opening and the refusal are the two layouts
//! every version keeps.

use std::fmt;
use std::io;
use std::time::Duration;

use bytes::BytesMut;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use super::wire::{recv, send, Message};
use crate::persist::codec::{Dec, DecodeError, Enc};

/// The cluster secret peers must know.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// A secret of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Secret {
        Secret(bytes.into())
    }

    /// Whether there is none (allowed only when every peer is on loopback).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never in a log.
        f.write_str(if self.0.is_empty() {
            "<none>"
        } else {
            "<secret>"
        })
    }
}

/// How long a peer may take over its side of the handshake (TLS's included), either side.
pub const HANDSHAKE: Duration = Duration::from_secs(5);

/// The version of what peers say to each other (this handshake, `wire.rs`'s requests and
/// answers, the entries they carry): raised by any change to it that an older node could not
/// read.
pub const WIRE_VERSION: u64 = 1;

type Nonce = [u8; 32];
type Proof = [u8; 32];

/// The handshake's messages, each one frame.
enum Shake {
    /// Dialing side, in [`WIRE_VERSION`]: its nonce, and the node id it means to reach.
    Hello { nonce: Nonce, to: u64 },
    /// Dialing side: a hello in another version, of which only the version is read.
    Foreign { version: u64 },
    /// Listening side: its nonce and proof.
    Challenge { nonce: Nonce, proof: Proof },
    /// Dialing side: its proof.
    Proof { proof: Proof },
    /// Listening side: go on.
    Accepted,
    /// Listening side: refused, and why.
    Refused { why: String },
}

const HELLO: u8 = 1;
const CHALLENGE: u8 = 2;
const PROOF: u8 = 3;
const ACCEPTED: u8 = 4;
const REFUSED: u8 = 5;

fn dec_32(d: &mut Dec) -> Result<[u8; 32], DecodeError> {
    d.bytes()?[..]
        .try_into()
        .map_err(|_| DecodeError("not 32 bytes"))
}

impl Message for Shake {
    fn put(&self, out: &mut BytesMut) {
        let mut e = Enc(out);
        match self {
            Shake::Hello { nonce, to } => {
                e.u8(HELLO);
                e.u64(WIRE_VERSION);
                e.bytes(nonce);
                e.u64(*to);
            }
            Shake::Foreign { .. } => unreachable!("only read: this node says hello in its own"),
            Shake::Challenge { nonce, proof } => {
                e.u8(CHALLENGE);
                e.bytes(nonce);
                e.bytes(proof);
            }
            Shake::Proof { proof } => {
                e.u8(PROOF);
                e.bytes(proof);
            }
            Shake::Accepted => e.u8(ACCEPTED),
            Shake::Refused { why } => {
                e.u8(REFUSED);
                e.bytes(why.as_bytes());
            }
        }
    }

    fn get(d: &mut Dec) -> Result<Shake, DecodeError> {
        Ok(match d.u8()? {
            HELLO => match d.u64()? {
                WIRE_VERSION => Shake::Hello {
                    nonce: dec_32(d)?,
                    to: d.u64()?,
                },
                version => {
                    d.skip_rest();
                    Shake::Foreign { version }
                }
            },
            CHALLENGE => Shake::Challenge {
                nonce: dec_32(d)?,
                proof: dec_32(d)?,
            },
            PROOF => Shake::Proof { proof: dec_32(d)? },
            ACCEPTED => Shake::Accepted,
            REFUSED => Shake::Refused {
                why: String::from_utf8_lossy(&d.bytes()?).into_owned(),
            },
            _ => return Err(DecodeError("unknown handshake message")),
        })
    }
}

/// Handshake frames are small; a peer that sends a big one is not a peer.
const MAX_HELLO: usize = 1024;

fn nonce() -> Nonce {
    let mut n = [0u8; 32];
    getrandom::getrandom(&mut n).expect("the OS CSPRNG is available");
    n
}

/// Which side a proof is from.
#[derive(Clone, Copy)]
enum Side {
    Dialing,
    Listening,
}

fn mac(secret: &Secret, side: Side, to: u64, dialing: &Nonce, listening: &Nonce) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&secret.0).expect("HMAC takes a key of any size");
    mac.update(match side {
        Side::Dialing => b"permitd cluster: dialing",
        Side::Listening => b"permitd cluster: listening",
    });
    mac.update(&to.to_le_bytes());
    mac.update(dialing);
    mac.update(listening);
    mac
}

fn proof(secret: &Secret, side: Side, to: u64, dialing: &Nonce, listening: &Nonce) -> Proof {
    mac(secret, side, to, dialing, listening)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `got` is the proof (compared in constant time).
fn verify(
    secret: &Secret,
    side: Side,
    to: u64,
    dialing: &Nonce,
    listening: &Nonce,
    got: &Proof,
) -> bool {
    mac(secret, side, to, dialing, listening)
        .verify_slice(got)
        .is_ok()
}

fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.into())
}

fn unexpected() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "unexpected handshake message")
}

/// The dialing side's handshake with node `to`: Ok once both sides proved the secret.
pub async fn dial<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
    to: u64,
) -> io::Result<()> {
    let mine = nonce();
    send(s, &Shake::Hello { nonce: mine, to }).await?;
    let (theirs, their_proof) = match recv(s, MAX_HELLO).await? {
        Shake::Challenge { nonce, proof } => (nonce, proof),
        Shake::Refused { why } => return Err(refused(why)),
        _ => return Err(unexpected()),
    };
    if !verify(secret, Side::Listening, to, &mine, &theirs, &their_proof) {
        // Told, so that the other side logs the refusal too.
        let why = "wrong cluster secret".to_string();
        send(s, &Shake::Refused { why }).await?;
        return Err(refused(format!(
            "node {to} does not know the cluster secret"
        )));
    }
    let proof = proof(secret, Side::Dialing, to, &mine, &theirs);
    send(s, &Shake::Proof { proof }).await?;
    match recv(s, MAX_HELLO).await? {
        Shake::Accepted => Ok(()),
        Shake::Refused { why } => Err(refused(why)),
        _ => Err(unexpected()),
    }
}

/// The listening side's handshake as node `me`: Ok once the dialing side proved the secret;
/// a refusal is answered (so the other side can say why) and returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
    me: u64,
) -> io::Result<()> {
    let (theirs, to) = match recv(s, MAX_HELLO).await? {
        Shake::Hello { nonce, to } => (nonce, to),
        Shake::Foreign { version } => {
            let why = format!(
                "node {me} speaks peer protocol version {WIRE_VERSION}, the dialing node version \
                 {version}: every node of a cluster must run a permitd of the same version"
            );
            send(s, &Shake::Refused { why: why.clone() }).await?;
            return Err(refused(why));
        }
        _ => return Err(unexpected()),
    };
    if to != me {
        let why = format!("this is node {me}, not node {to}");
        send(s, &Shake::Refused { why: why.clone() }).await?;
        return Err(refused(why));
    }
    let mine = nonce();
    let proof = proof(secret, Side::Listening, me, &theirs, &mine);
    send(s, &Shake::Challenge { nonce: mine, proof }).await?;
    let got = match recv(s, MAX_HELLO).await? {
        Shake::Proof { proof } => proof,
        Shake::Refused { why } => return Err(refused(why)),
        _ => return Err(unexpected()),
    };
    if !verify(secret, Side::Dialing, me, &theirs, &mine, &got) {
        let why = "wrong cluster secret".to_string();
        send(s, &Shake::Refused { why: why.clone() }).await?;
        return Err(refused(why));
    }
    send(s, &Shake::Accepted).await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(
        dialing: &Secret,
        listening: &Secret,
        to: u64,
    ) -> (io::Result<()>, io::Result<()>) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        tokio::join!(dial(&mut a, dialing, to), accept(&mut b, listening, 2))
    }

    #[tokio::test]
    async fn the_same_secret_passes_and_another_is_refused_on_both_sides() {
        let s = Secret::new("s3cret");
        let (d, l) = pair(&s, &s, 2).await;
        assert!(d.is_ok() && l.is_ok(), "{d:?} {l:?}");
        let none = Secret::default();
        let (d, l) = pair(&none, &none, 2).await;
        assert!(d.is_ok() && l.is_ok(), "{d:?} {l:?}");

        // The dialing side holds the wrong one: the listening side's proof fails its check.
        let (d, l) = pair(&Secret::new("other"), &s, 2).await;
        assert!(l.unwrap_err().to_string().contains("wrong cluster secret"));
        let d = d.unwrap_err();
        assert_eq!(d.kind(), io::ErrorKind::PermissionDenied);
        assert!(
            d.to_string().contains("does not know the cluster secret"),
            "{d}"
        );
        // No secret on one side only is a wrong secret too.
        let (d, _) = pair(&none, &s, 2).await;
        assert_eq!(d.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    }

    #[tokio::test]
    async fn a_dialer_that_skips_the_check_is_still_refused() {
        // A peer that ignores the listening side's proof and answers a made-up one.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let s = Secret::new("s3cret");
        let rogue = async {
            send(
                &mut a,
                &Shake::Hello {
                    nonce: [7; 32],
                    to: 2,
                },
            )
            .await
            .unwrap();
            let Shake::Challenge { nonce, .. } = recv(&mut a, MAX_HELLO).await.unwrap() else {
                panic!("no challenge");
            };
            let proof = proof(&Secret::new("guess"), Side::Dialing, 2, &[7; 32], &nonce);
            send(&mut a, &Shake::Proof { proof }).await.unwrap();
            recv::<Shake>(&mut a, MAX_HELLO).await.unwrap()
        };
        let (answer, l) = tokio::join!(rogue, accept(&mut b, &s, 2));
        assert!(matches!(answer, Shake::Refused { ref why } if why == "wrong cluster secret"));
        assert!(l.unwrap_err().to_string().contains("wrong cluster secret"));
    }

    /// A later version's hello: its tag and version, then what that version says (here a nonce,
    /// the node id and a field this version does not have).
    struct LaterHello;

    impl Message for LaterHello {
        fn put(&self, out: &mut BytesMut) {
            let mut e = Enc(out);
            e.u8(HELLO);
            e.u64(WIRE_VERSION + 1);
            e.bytes(&[7; 32]);
            e.u64(2);
            e.bytes(b"something new");
        }

        fn get(_: &mut Dec) -> Result<LaterHello, DecodeError> {
            unreachable!("only sent")
        }
    }

    #[tokio::test]
    async fn a_node_of_another_peer_protocol_version_is_refused_saying_why() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let s = Secret::new("s3cret");
        let later = async {
            send(&mut a, &LaterHello).await.unwrap();
            recv::<Shake>(&mut a, MAX_HELLO).await.unwrap()
        };
        let (answer, l) = tokio::join!(later, accept(&mut b, &s, 2));
        let why = "node 2 speaks peer protocol version 1, the dialing node version 2";
        assert!(matches!(answer, Shake::Refused { why: ref w } if w.starts_with(why)));
        let l = l.unwrap_err();
        assert_eq!(l.kind(), io::ErrorKind::PermissionDenied);
        assert!(l.to_string().starts_with(why), "{l}");
    }

    #[tokio::test]
    async fn a_hello_for_another_node_is_refused() {
        let s = Secret::new("s3cret");
        let (d, l) = pair(&s, &s, 3).await;
        assert!(d
            .unwrap_err()
            .to_string()
            .contains("this is node 2, not node 3"));
        assert!(l.is_err());
    }

    #[test]
    fn the_secret_never_shows_in_debug() {
        assert_eq!(format!("{:?}", Secret::new("s3cret")), "<secret>");
        assert_eq!(format!("{:?}", Secret::default()), "<none>");
    }
}
