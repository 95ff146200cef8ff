//! The expected Intel TDX build-time measurement (MRTD) of the appliance's TD firmware.
//!
//! A TDX host builds a TD from its firmware image (the TDVF, `scripts/tdvf-build.sh`) as the
//! firmware's TDX metadata tells it: the metadata lists sections (boot firmware volume,
//! configuration volume, TD HOB, temporary memory, ...), each with its place in the image (raw
//! offset and size), its guest-physical place (memory address and size), a type and attributes.
//! The host adds every page of every section with `TDH.MEM.PAGE.ADD` (sections marked
//! `PAGE.AUG` excepted: the guest accepts those later) and, for the sections marked
//! `MR.EXTEND`, extends each page's content with `TDH.MR.EXTEND`, 256 bytes at a time. The TDX
//! module hashes every such operation into one SHA-384 computation, finished by
//! `TDH.MR.FINALIZE`: that digest is MRTD, reported in every TD quote.
//!
//! What the TDX module hashes for each operation (Intel TDX module ABI specification):
//! - `TDH.MEM.PAGE.ADD`: a 128-byte record, the ASCII bytes `MEM.PAGE.ADD` at offset 0, the
//!   page's guest-physical address (little-endian u64) at offset 16, zeros elsewhere;
//! - `TDH.MR.EXTEND`: a 128-byte record, `MR.EXTEND` at offset 0 and the chunk's
//!   guest-physical address at offset 16, zeros elsewhere, followed by the chunk's 256 bytes.
//!
//! The order of the operations is the host's ([`PageOrder`]): sections always in metadata order,
//! and within a section either each page's `TDH.MEM.PAGE.ADD` followed by the `TDH.MR.EXTEND`
//! of its 16 chunks (upstream Linux KVM and QEMU: KVM_TDX_INIT_MEM_REGION populates page by
//! page) or all of the section's pages added first and then all extended (some earlier,
//! pre-upstream TDX host stacks). The two orders hash the same records, so both MRTDs identify
//! the same firmware; a verifier that does not know the host's stack accepts both. Nothing else
//! of the host (memory size, vCPUs, ACPI tables) enters MRTD: QEMU
//! writes the TD HOB into its section, but the TDVF does not mark that section `MR.EXTEND`
//! (a firmware that did is refused, since its MRTD would depend on the host).
//!
//! Where the firmware keeps its metadata: the image ends with the OVMF GUIDed table (footer
//! GUID `96b582de-1fb2-45f7-baea-a366c55a082d` 48 bytes before the end, the table's length in
//! the two bytes before it; each entry is its data, a u16 length and a GUID, read backwards
//! from the footer). The entry `e47a6535-984a-4798-865e-4685a7bf8ec2` holds a u32: the
//! distance from the end of the image to the metadata descriptor (`TDVF`, length, version 1,
//! section count, then 32 bytes per section).
//!
//! RTMR2 of measured direct boot ([`direct_boot_rtmr2`]) is what the boot chain would extend
//! into it from the image's artifacts alone: the TDVF's QEMU loader hands the kernel the
//! command line as UEFI load options (UTF-16, ` initrd=initrd` appended when QEMU passes an
//! initrd, NUL-terminated), and the kernel's EFI stub measures the load options and then the
//! initrd into PCR 9, which the TDVF maps to RTMR2. No TD launch has confirmed this value, so the
//! reference values record it without enforcing it; RTMR0 and RTMR1 depend on the host
//! (docs/deploy-airgapped.md, section 7).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha384};

/// The size of MRTD in bytes (SHA-384).
pub const MRTD_LEN: usize = 48;

/// The page size of `TDH.MEM.PAGE.ADD`.
pub const PAGE_SIZE: u64 = 0x1000;

/// The number of bytes one `TDH.MR.EXTEND` measures.
pub const MR_EXTEND_CHUNK: usize = 256;

/// The attribute bit of a section whose content is measured (`MR.EXTEND`).
pub const ATTRIBUTE_MR_EXTEND: u32 = 0x1;

/// The attribute bit of a section the guest accepts at run time rather than the host adding
/// it at build time (`PAGE.AUG`); such sections do not enter MRTD.
pub const ATTRIBUTE_PAGE_AUG: u32 = 0x2;

/// The GUID (in its on-disk byte order) of the OVMF GUIDed table's footer.
const TABLE_FOOTER_GUID: [u8; 16] = guid_bytes(
    0x96b5_82de,
    0x1fb2,
    0x45f7,
    [0xba, 0xea, 0xa3, 0x66, 0xc5, 0x5a, 0x08, 0x2d],
);

/// The GUID of the table entry holding the offset of the TDX metadata.
const TDX_METADATA_OFFSET_GUID: [u8; 16] = guid_bytes(
    0xe47a_6535,
    0x984a,
    0x4798,
    [0x86, 0x5e, 0x46, 0x85, 0xa7, 0xbf, 0x8e, 0xc2],
);

/// The footer GUID ends this many bytes before the end of the image.
const TABLE_END_FROM_IMAGE_END: usize = 0x20;

/// The size of an entry's length field plus its GUID.
const ENTRY_TRAILER: usize = 2 + 16;

/// The size of the metadata descriptor's header (signature, length, version, count).
const DESCRIPTOR_HEADER: usize = 16;

/// The size of one section entry of the metadata.
const SECTION_ENTRY: usize = 32;

/// An EFI GUID in its on-disk form: the first three fields little-endian, the rest as written.
const fn guid_bytes(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

/// Why the firmware's metadata could not be read or its MRTD computed.
#[derive(Debug, thiserror::Error)]
pub enum TdxMeasurementError {
    /// The firmware file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The image has no OVMF GUIDed table, or the table has no TDX metadata entry: it is not a
    /// TDX firmware (e.g. the AmdSev OVMF).
    #[error("the firmware has no TDX metadata ({0}): use a TDX firmware (scripts/tdvf-build.sh)")]
    NoTdxMetadata(&'static str),
    /// The TDX metadata is present but malformed or inconsistent with the image.
    #[error("malformed TDX metadata: {0}")]
    Malformed(String),
    /// The initrd could not be read.
    #[error("cannot read the initrd {path}: {source}")]
    ReadInitrd {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A section whose content the host provides (the TD HOB) is marked `MR.EXTEND`, so MRTD
    /// would depend on the host.
    #[error(
        "section {index} ({kind}) is measured but its content is written by the host: MRTD would depend on the host"
    )]
    HostContentMeasured {
        /// The section's index in the metadata.
        index: usize,
        /// The section's type.
        kind: SectionType,
    },
}

/// The type of a TDVF metadata section (TDVF design guide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionType {
    /// The boot firmware volume: the firmware's code.
    Bfv,
    /// The configuration firmware volume: the UEFI variable store.
    Cfv,
    /// The TD HOB, which the host fills with the memory layout.
    TdHob,
    /// Temporary memory (stacks, heap, page tables), zero when added.
    TempMem,
    /// Permanent memory.
    PermMem,
    /// A payload image.
    Payload,
    /// A payload's parameters.
    PayloadParam,
    /// A type this module does not know, with its number.
    Other(u32),
}

impl SectionType {
    fn from_u32(value: u32) -> Self {
        match value {
            0 => Self::Bfv,
            1 => Self::Cfv,
            2 => Self::TdHob,
            3 => Self::TempMem,
            4 => Self::PermMem,
            5 => Self::Payload,
            6 => Self::PayloadParam,
            other => Self::Other(other),
        }
    }
}

impl std::fmt::Display for SectionType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Bfv => f.write_str("BFV"),
            Self::Cfv => f.write_str("CFV"),
            Self::TdHob => f.write_str("TD_HOB"),
            Self::TempMem => f.write_str("TempMem"),
            Self::PermMem => f.write_str("PermMem"),
            Self::Payload => f.write_str("Payload"),
            Self::PayloadParam => f.write_str("PayloadParam"),
            Self::Other(n) => write!(f, "type {n}"),
        }
    }
}

/// One section of the TDVF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TdvfSection {
    /// Where the section's initial content starts in the firmware image.
    pub data_offset: u32,
    /// How many bytes of initial content the image holds (0 for memory the host zeroes).
    pub raw_data_size: u32,
    /// The guest-physical address the section is loaded at (page-aligned).
    pub memory_address: u64,
    /// The section's size in guest memory (a multiple of the page size).
    pub memory_data_size: u64,
    /// The section's type.
    pub section_type: SectionType,
    /// The attribute bits ([`ATTRIBUTE_MR_EXTEND`], [`ATTRIBUTE_PAGE_AUG`]).
    pub attributes: u32,
}

impl TdvfSection {
    /// Whether the host extends MRTD with the section's content (`MR.EXTEND`).
    pub fn extends_mrtd(&self) -> bool {
        self.attributes & ATTRIBUTE_MR_EXTEND != 0
    }

    /// Whether the guest accepts the section at run time instead of the host adding it
    /// (`PAGE.AUG`); such a section does not enter MRTD.
    pub fn page_aug(&self) -> bool {
        self.attributes & ATTRIBUTE_PAGE_AUG != 0
    }

    /// The number of pages the section spans in guest memory.
    pub fn pages(&self) -> u64 {
        self.memory_data_size / PAGE_SIZE
    }
}

/// A TDX firmware image (TDVF) and its parsed metadata.
#[derive(Debug, Clone)]
pub struct Tdvf {
    image: Vec<u8>,
    version: u32,
    sections: Vec<TdvfSection>,
}

impl Tdvf {
    /// Reads and parses the firmware file at `path`.
    pub fn from_file(path: &Path) -> Result<Self, TdxMeasurementError> {
        let image = std::fs::read(path).map_err(|source| TdxMeasurementError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_bytes(image)
    }

    /// Parses a firmware image: finds the TDX metadata through the OVMF GUIDed table and
    /// checks every section against the image.
    pub fn from_bytes(image: Vec<u8>) -> Result<Self, TdxMeasurementError> {
        let offset_entry = find_table_entry(&image, &TDX_METADATA_OFFSET_GUID)?
            .ok_or(TdxMeasurementError::NoTdxMetadata("no TDX metadata entry"))?;
        let distance = offset_entry
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| malformed("the TDX metadata entry is shorter than 4 bytes"))?;
        let start = image.len().checked_sub(distance).ok_or_else(|| {
            malformed(format!(
                "the metadata lies {distance} bytes before the end of a {}-byte image",
                image.len()
            ))
        })?;
        let header = image
            .get(start..start + DESCRIPTOR_HEADER)
            .ok_or_else(|| malformed("the descriptor runs past the end of the image"))?;
        if &header[..4] != b"TDVF" {
            return Err(malformed(format!(
                "the descriptor's signature is {:02x?}, not \"TDVF\"",
                &header[..4]
            )));
        }
        let length = read_u32(header, 4) as usize;
        let version = read_u32(header, 8);
        let count = read_u32(header, 12) as usize;
        if version != 1 {
            return Err(malformed(format!(
                "descriptor version {version} (only version 1 is defined)"
            )));
        }
        if count == 0 {
            return Err(malformed("the descriptor lists no sections"));
        }
        let needed = count
            .checked_mul(SECTION_ENTRY)
            .and_then(|n| n.checked_add(DESCRIPTOR_HEADER))
            .ok_or_else(|| malformed(format!("{count} sections")))?;
        if length < needed {
            return Err(malformed(format!(
                "the descriptor's length {length} is too small for {count} sections"
            )));
        }
        let table = image
            .get(start + DESCRIPTOR_HEADER..start + needed)
            .ok_or_else(|| malformed(format!("{count} sections run past the end of the image")))?;
        let sections = table
            .chunks_exact(SECTION_ENTRY)
            .enumerate()
            .map(|(index, entry)| check_section(index, parse_section(entry), image.len()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            image,
            version,
            sections,
        })
    }

    /// The metadata's version (1).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The sections, in metadata order (the order the host adds them in).
    pub fn sections(&self) -> &[TdvfSection] {
        &self.sections
    }

    /// The content of page `page` of `section` as the host adds it: the section's raw data
    /// from the image at that place, zeros past the raw data.
    pub fn page_content(&self, section: &TdvfSection, page: u64) -> [u8; PAGE_SIZE as usize] {
        let mut content = [0u8; PAGE_SIZE as usize];
        let raw = &self.image[section.data_offset as usize..][..section.raw_data_size as usize];
        let start = (page * PAGE_SIZE) as usize;
        if let Some(rest) = raw.get(start..) {
            let n = rest.len().min(content.len());
            content[..n].copy_from_slice(&rest[..n]);
        }
        content
    }

    /// MRTD of a TD built from this firmware by an upstream KVM host: [`Tdvf::mrtd_in_order`]
    /// with [`PageOrder::PerPage`].
    pub fn mrtd(&self) -> Result<[u8; MRTD_LEN], TdxMeasurementError> {
        self.mrtd_in_order(PageOrder::PerPage)
    }

    /// MRTD of a TD built from this firmware with the host's operations in `order`: SHA-384
    /// over the `TDH.MEM.PAGE.ADD` record of every page of every section not marked `PAGE.AUG`
    /// and, for the sections marked `MR.EXTEND`, the `TDH.MR.EXTEND` record and content of each
    /// 256-byte chunk of each page.
    pub fn mrtd_in_order(&self, order: PageOrder) -> Result<[u8; MRTD_LEN], TdxMeasurementError> {
        let mut hasher = Sha384::new();
        for (index, section) in self.sections.iter().enumerate() {
            if section.page_aug() {
                continue;
            }
            if section.extends_mrtd() && section.section_type == SectionType::TdHob {
                return Err(TdxMeasurementError::HostContentMeasured {
                    index,
                    kind: section.section_type,
                });
            }
            let pages = 0..section.pages();
            match order {
                PageOrder::PerPage => {
                    for page in pages {
                        add_page(&mut hasher, section, page);
                        self.extend_page(&mut hasher, section, page);
                    }
                }
                PageOrder::PerSection => {
                    for page in pages.clone() {
                        add_page(&mut hasher, section, page);
                    }
                    for page in pages {
                        self.extend_page(&mut hasher, section, page);
                    }
                }
            }
        }
        Ok(hasher.finalize().into())
    }

    /// Hashes the `TDH.MR.EXTEND` operations of one page, if its section is measured.
    fn extend_page(&self, hasher: &mut Sha384, section: &TdvfSection, page: u64) {
        if !section.extends_mrtd() {
            return;
        }
        let gpa = section.memory_address + page * PAGE_SIZE;
        let content = self.page_content(section, page);
        for (i, chunk) in content.chunks_exact(MR_EXTEND_CHUNK).enumerate() {
            hasher.update(operation_record(
                b"MR.EXTEND",
                gpa + (i * MR_EXTEND_CHUNK) as u64,
            ));
            hasher.update(chunk);
        }
    }
}

/// The order in which the host adds and measures a section's pages (the TDX module hashes the
/// operations in the order the host issues them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOrder {
    /// Each page added, then its chunks extended, page after page: upstream Linux KVM with QEMU.
    PerPage,
    /// All of a section's pages added, then all of them extended: some earlier, pre-upstream
    /// TDX host stacks.
    PerSection,
}

/// Hashes the `TDH.MEM.PAGE.ADD` operation of one page.
fn add_page(hasher: &mut Sha384, section: &TdvfSection, page: u64) {
    hasher.update(operation_record(
        b"MEM.PAGE.ADD",
        section.memory_address + page * PAGE_SIZE,
    ));
}

/// The 128-byte record the TDX module hashes for one operation: its name, the guest-physical
/// address at offset 16, zeros elsewhere.
fn operation_record(name: &[u8], gpa: u64) -> [u8; 128] {
    let mut record = [0u8; 128];
    record[..name.len()].copy_from_slice(name);
    record[16..24].copy_from_slice(&gpa.to_le_bytes());
    record
}

fn malformed(reason: impl Into<String>) -> TdxMeasurementError {
    TdxMeasurementError::Malformed(reason.into())
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn parse_section(entry: &[u8]) -> TdvfSection {
    TdvfSection {
        data_offset: read_u32(entry, 0),
        raw_data_size: read_u32(entry, 4),
        memory_address: read_u64(entry, 8),
        memory_data_size: read_u64(entry, 16),
        section_type: SectionType::from_u32(read_u32(entry, 24)),
        attributes: read_u32(entry, 28),
    }
}

/// Checks one section the way a host does before it builds the TD.
fn check_section(
    index: usize,
    section: TdvfSection,
    image_len: usize,
) -> Result<TdvfSection, TdxMeasurementError> {
    let bad = |reason: String| {
        malformed(format!(
            "section {index} ({}): {reason}",
            section.section_type
        ))
    };
    if !section.memory_address.is_multiple_of(PAGE_SIZE) {
        return Err(bad(format!(
            "memory address {:#x} is not page-aligned",
            section.memory_address
        )));
    }
    if section.memory_data_size == 0 || !section.memory_data_size.is_multiple_of(PAGE_SIZE) {
        return Err(bad(format!(
            "memory size {:#x} is not a non-zero multiple of the page size",
            section.memory_data_size
        )));
    }
    if section
        .memory_address
        .checked_add(section.memory_data_size)
        .is_none()
    {
        return Err(bad("memory range overflows".into()));
    }
    if u64::from(section.raw_data_size) > section.memory_data_size {
        return Err(bad(format!(
            "raw size {:#x} exceeds memory size {:#x}",
            section.raw_data_size, section.memory_data_size
        )));
    }
    let raw_end = section.data_offset as usize + section.raw_data_size as usize;
    if raw_end > image_len {
        return Err(bad(format!(
            "raw data {:#x}..{raw_end:#x} runs past the {image_len:#x}-byte image",
            section.data_offset
        )));
    }
    if section.attributes & !(ATTRIBUTE_MR_EXTEND | ATTRIBUTE_PAGE_AUG) != 0 {
        return Err(bad(format!("unknown attributes {:#x}", section.attributes)));
    }
    Ok(section)
}

/// The data of the OVMF GUIDed table entry `guid`, None when the table has no such entry, an
/// error when the image has no table or a malformed one.
fn find_table_entry<'a>(
    image: &'a [u8],
    guid: &[u8; 16],
) -> Result<Option<&'a [u8]>, TdxMeasurementError> {
    let table_end = image
        .len()
        .checked_sub(TABLE_END_FROM_IMAGE_END)
        .filter(|end| *end >= ENTRY_TRAILER)
        .ok_or(TdxMeasurementError::NoTdxMetadata("the image is too small"))?;
    if image[table_end - 16..table_end] != TABLE_FOOTER_GUID {
        return Err(TdxMeasurementError::NoTdxMetadata(
            "no OVMF GUIDed table footer",
        ));
    }
    let table_len = u16::from_le_bytes([image[table_end - 18], image[table_end - 17]]) as usize;
    let table_start = table_end
        .checked_sub(table_len)
        .filter(|_| table_len >= ENTRY_TRAILER)
        .ok_or_else(|| malformed(format!("the GUIDed table's length {table_len} is invalid")))?;
    // The footer's own entry is its length and GUID; the entries before it are read backwards.
    let mut end = table_end - ENTRY_TRAILER;
    while end > table_start {
        if end - table_start < ENTRY_TRAILER {
            return Err(malformed("a GUIDed table entry is truncated"));
        }
        let entry_guid = &image[end - 16..end];
        let entry_len = u16::from_le_bytes([image[end - 18], image[end - 17]]) as usize;
        if entry_len < ENTRY_TRAILER || entry_len > end - table_start {
            return Err(malformed(format!(
                "a GUIDed table entry has the invalid length {entry_len}"
            )));
        }
        if entry_guid == guid {
            return Ok(Some(&image[end - entry_len..end - ENTRY_TRAILER]));
        }
        end -= entry_len;
    }
    Ok(None)
}

/// The UEFI load options the TDVF's QEMU kernel loader gives a directly booted kernel: the
/// command line with ` initrd=initrd` appended when an initrd is passed, as UTF-16LE with a
/// terminating NUL (each command-line byte widened to one UTF-16 unit, as the firmware does).
pub fn direct_boot_load_options(cmdline: &str, with_initrd: bool) -> Vec<u8> {
    let suffix = if with_initrd { " initrd=initrd" } else { "" };
    cmdline
        .bytes()
        .chain(suffix.bytes())
        .chain(std::iter::once(0))
        .flat_map(|b| u16::from(b).to_le_bytes())
        .collect()
}

/// Extends a measurement register: SHA-384 of its value followed by the digest.
pub fn rtmr_extend(register: &[u8; MRTD_LEN], digest: &[u8; MRTD_LEN]) -> [u8; MRTD_LEN] {
    let mut hasher = Sha384::new();
    hasher.update(register);
    hasher.update(digest);
    hasher.finalize().into()
}

/// RTMR2 of measured direct boot as the image's artifacts determine it, with its two events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectBootRtmr2 {
    /// The load options ([`direct_boot_load_options`]) the kernel's EFI stub measures.
    pub load_options: Vec<u8>,
    /// SHA-384 of the load options: the first event's digest.
    pub load_options_sha384: [u8; MRTD_LEN],
    /// SHA-384 of the initrd: the second event's digest.
    pub initrd_sha384: [u8; MRTD_LEN],
    /// RTMR2: zero extended with the two digests in that order.
    pub rtmr2: [u8; MRTD_LEN],
}

/// RTMR2 of measured direct boot with the command line `cmdline` and the initrd file `initrd`:
/// the kernel's EFI stub extends PCR 9 (RTMR2 in a TD) with SHA-384 of the load options
/// (event tag `LOADED_IMAGE::LoadOptions`), then with SHA-384 of the initrd (`Linux initrd`).
/// It assumes that nothing else extends RTMR2 before the value is quoted (true of the TDVF and
/// a kernel without RTMR-extending IMA; not confirmed on a TD).
pub fn direct_boot_rtmr2(
    cmdline: &str,
    initrd: &Path,
) -> Result<DirectBootRtmr2, TdxMeasurementError> {
    let read_error = |source| TdxMeasurementError::ReadInitrd {
        path: initrd.display().to_string(),
        source,
    };
    let mut file = std::fs::File::open(initrd).map_err(read_error)?;
    let mut hasher = Sha384::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(read_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    let initrd_sha384: [u8; MRTD_LEN] = hasher.finalize().into();
    let load_options = direct_boot_load_options(cmdline, true);
    let load_options_sha384: [u8; MRTD_LEN] = Sha384::digest(&load_options).into();
    let rtmr2 = rtmr_extend(
        &rtmr_extend(&[0; MRTD_LEN], &load_options_sha384),
        &initrd_sha384,
    );
    Ok(DirectBootRtmr2 {
        load_options,
        load_options_sha384,
        initrd_sha384,
        rtmr2,
    })
}
