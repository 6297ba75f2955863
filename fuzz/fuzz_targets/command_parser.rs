//! `cargo fuzz run command_parser`: see `permitd_fuzz::command_parser` for the input format and the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| permitd_fuzz::command_parser(data));
