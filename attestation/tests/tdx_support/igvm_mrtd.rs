//! MRTD of a TDVF computed by an independent implementation of the TDX module's hashing: the
//! `igvm` crate's `generate_tdx_measurement`, fed one IGVM page directive per page the host
//! adds (shared by `tests/tdx_measurement.rs` and `examples/tdx_mrtd.rs`).

use igvm::IgvmDirectiveHeader;
use igvm_defs::{IgvmPageDataFlags, IgvmPageDataType};
use inferno_attestation::tdx_measurement::{MRTD_LEN, PAGE_SIZE, Tdvf};

/// The IGVM compatibility mask the directives carry.
const MASK: u32 = 1;

/// MRTD by the `igvm` crate, from the sections this crate parsed: every page of every section
/// not marked `PAGE.AUG` is one page directive, measured (its content extended) when the section
/// is marked `MR.EXTEND`, unmeasured (only added) otherwise.
pub fn igvm_mrtd(tdvf: &Tdvf) -> [u8; MRTD_LEN] {
    let mut directives = Vec::new();
    for section in tdvf.sections().iter().filter(|s| !s.page_aug()) {
        for page in 0..section.pages() {
            let measured = section.extends_mrtd();
            directives.push(IgvmDirectiveHeader::PageData {
                gpa: section.memory_address + page * PAGE_SIZE,
                compatibility_mask: MASK,
                flags: IgvmPageDataFlags::new().with_unmeasured(!measured),
                data_type: IgvmPageDataType::NORMAL,
                data: if measured {
                    tdvf.page_content(section, page).to_vec()
                } else {
                    Vec::new()
                },
            });
        }
    }
    igvm::measurement::generate_tdx_measurement(&directives, MASK).expect("igvm computes MRTD")
}
