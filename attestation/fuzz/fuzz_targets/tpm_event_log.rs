//! TCG event-log parser and replay: any input fails cleanly or replays every bank it declares.
#![no_main]

use inferno_attestation::tpm::eventlog::{EventLog, PCR_COUNT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(log) = EventLog::parse(data) {
        for bank in &log.banks {
            if let Ok(replay) = log.replay(*bank) {
                assert_eq!(replay.values.len(), usize::from(PCR_COUNT));
            }
        }
    }
});
