//! `cargo fuzz run engine`: see `permitd_fuzz::engine` for the input format and the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| permitd_fuzz::engine(data));
