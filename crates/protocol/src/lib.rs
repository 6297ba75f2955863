//! The wire: Redis's request grammar in, RESP2/RESP3 replies out, and the error codes a client
//! sees (SPEC §5). The bottom layer: it knows nothing of commands or the engine.

#![warn(missing_docs)]

pub mod error;
pub mod reply;
pub mod request;

pub use reply::{Proto, Reply};
pub use request::{ProtocolError, RequestLimits, RequestParser};
