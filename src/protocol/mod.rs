//! The wire: Redis's request grammar in, RESP2/RESP3 replies out.

pub mod reply;
pub mod request;

pub use reply::{Proto, Reply};
pub use request::{ProtocolError, RequestLimits, RequestParser};
