//! RIM (SWID tag) parser: any input fails cleanly or parses.
#![no_main]

use inferno_attestation::nvidia::rim::{ParsedRim, RimKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ParsedRim::parse(data, RimKind::Driver);
});
