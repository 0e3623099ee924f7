//! What one kernel of a CUBIN (NVIDIA's ELF, `EM_CUDA`) costs, read from its section headers and the
//! `.nv.info` attributes: registers per thread (`EIATTR_REGCOUNT`; before sm_90 also the high byte of
//! the `.text.<kernel>` section's `sh_info`), static shared memory (the size of `.nv.shared.<kernel>`)
//! and the per-thread stack (`EIATTR_MAX_STACK_SIZE`), as `cuobjdump --dump-resource-usage` reports them.

/// One kernel's resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinResources {
    /// The kernel's entry point (`.text.<entry>`).
    pub entry: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes (dynamic shared memory is given at launch).
    pub shared_bytes: u64,
    /// Stack per thread, bytes (local memory: spills and local arrays).
    pub stack_bytes: u64,
}

/// A section header of a 64-bit little-endian ELF.
struct Section {
    name: String,
    kind: u32,
    offset: u64,
    size: u64,
    info: u32,
}

const EM_CUDA: u16 = 190;
const SHT_NOBITS: u32 = 8;
/// `.nv.info` attributes: a function's registers; the most stack its calls may use.
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_MAX_STACK_SIZE: u8 = 0x23;
/// `.nv.info` attribute formats: no value, a byte, a half-word, a sized value. Every attribute starts
/// with four bytes (format, attribute, then the byte or half-word, or the size of what follows).
const EIFMT_NVAL: u8 = 1;
const EIFMT_BVAL: u8 = 2;
const EIFMT_HVAL: u8 = 3;
const EIFMT_SVAL: u8 = 4;

impl CubinResources {
    /// The resources of the CUBIN's one kernel (`what` names it in errors).
    pub fn read(cubin: &[u8], what: &str) -> Result<Self, String> {
        let sections = sections(cubin)?;
        let mut texts = sections.iter().filter(|s| s.name.starts_with(".text."));
        let text = texts.next().ok_or(format!("{what}: the CUBIN has no .text.<kernel> section"))?;
        if texts.next().is_some() {
            return Err(format!("{what}: the CUBIN holds more than one kernel"));
        }
        let entry = text.name[".text.".len()..].to_string();
        let shared_bytes = sections.iter().find(|s| s.name == format!(".nv.shared.{entry}")).map_or(0, |s| s.size);
        let info =
            sections.iter().find(|s| s.name == ".nv.info").ok_or(format!("{what}: the CUBIN has no .nv.info"))?;
        let attributes = attributes(slice(cubin, info)?).ok_or(format!("{what}: a malformed .nv.info"))?;
        let one = |attribute: u8, name: &str| -> Result<Option<u32>, String> {
            let mut values = attributes.iter().filter(|(a, _)| *a == attribute).map(|(_, v)| *v);
            match (values.next(), values.next()) {
                (Some(_), Some(_)) => Err(format!("{what}: .nv.info has {name} of more than one function")),
                (v, _) => Ok(v),
            }
        };
        let registers = one(EIATTR_REGCOUNT, "EIATTR_REGCOUNT")?.unwrap_or(text.info >> 24);
        let stack_bytes = one(EIATTR_MAX_STACK_SIZE, "EIATTR_MAX_STACK_SIZE")?.unwrap_or(0) as u64;
        Ok(CubinResources { entry, registers, shared_bytes, stack_bytes })
    }
}

fn slice<'a>(bytes: &'a [u8], s: &Section) -> Result<&'a [u8], String> {
    if s.kind == SHT_NOBITS {
        return Ok(&[]);
    }
    let start = usize::try_from(s.offset).map_err(|_| "a section offset past the address space")?;
    let end = start.checked_add(usize::try_from(s.size).map_err(|_| "a section size past the address space")?);
    end.and_then(|end| bytes.get(start..end)).ok_or(format!("section {} lies outside the file", s.name))
}

/// The section headers, with their names.
fn sections(b: &[u8]) -> Result<Vec<Section>, String> {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return Err("not a 64-bit little-endian ELF".into());
    }
    let u16_at = |o: usize| b.get(o..o.checked_add(2)?).map(|x| u16::from_le_bytes([x[0], x[1]]));
    let u32_at = |o: usize| b.get(o..o.checked_add(4)?).map(|x| u32::from_le_bytes(x.try_into().expect("4 bytes")));
    let u64_at = |o: usize| b.get(o..o.checked_add(8)?).map(|x| u64::from_le_bytes(x.try_into().expect("8 bytes")));
    if u16_at(18) != Some(EM_CUDA) {
        return Err(format!("an ELF for machine {:?}, not EM_CUDA ({EM_CUDA})", u16_at(18)));
    }
    let bad = || "a section header table outside the file".to_string();
    let shoff = usize::try_from(u64_at(0x28).ok_or_else(bad)?).map_err(|_| bad())?;
    let (entsize, count, names_index) =
        (u16_at(0x3a).ok_or_else(bad)? as usize, u16_at(0x3c).ok_or_else(bad)? as usize, u16_at(0x3e).ok_or_else(bad)?);
    let mut raw = Vec::with_capacity(count);
    for i in 0..count {
        let h = shoff.checked_add(i * entsize).ok_or_else(bad)?;
        let field32 = |o: usize| h.checked_add(o).and_then(u32_at).ok_or_else(bad);
        let field64 = |o: usize| h.checked_add(o).and_then(u64_at).ok_or_else(bad);
        raw.push((field32(0)?, field32(4)?, field64(24)?, field64(32)?, field32(44)?));
    }
    let names = raw.get(names_index as usize).ok_or("no section-name table")?;
    let names = Section { name: ".shstrtab".into(), kind: names.1, offset: names.2, size: names.3, info: 0 };
    let table = slice(b, &names)?;
    raw.into_iter()
        .map(|(name, kind, offset, size, info)| {
            let start = table.get(name as usize..).ok_or("a section name outside .shstrtab")?;
            let end = start.iter().position(|&c| c == 0).ok_or("an unterminated section name")?;
            Ok(Section { name: String::from_utf8_lossy(&start[..end]).into_owned(), kind, offset, size, info })
        })
        .collect()
}

/// The per-function attributes (attribute, value) of a `.nv.info` section: those whose value is a
/// function's symbol index and a 32-bit number; `None` when the list is malformed.
fn attributes(info: &[u8]) -> Option<Vec<(u8, u32)>> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < info.len() {
        let (format, attribute) = (*info.get(i)?, *info.get(i + 1)?);
        let value_len = match format {
            EIFMT_NVAL | EIFMT_BVAL | EIFMT_HVAL => 2,
            EIFMT_SVAL => u16::from_le_bytes([*info.get(i + 2)?, *info.get(i + 3)?]) as usize + 2,
            _ => return None,
        };
        let value = info.get(i + 2..i + 2 + value_len)?;
        if format == EIFMT_SVAL && value.len() == 10 && [EIATTR_REGCOUNT, EIATTR_MAX_STACK_SIZE].contains(&attribute) {
            // (function symbol index: u32, the number: u32)
            out.push((attribute, u32::from_le_bytes(value[6..10].try_into().ok()?)));
        }
        i += 2 + value_len;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_read_in_four_byte_headers_and_sized_values() {
        let mut info = vec![0x01, 0x35, 0x00, 0x00]; // a flag
        info.extend([0x03, 0x19, 0x60, 0x00]); // a half-word
        info.extend([0x04, 0x2f, 0x08, 0x00, 7, 0, 0, 0, 40, 0, 0, 0]); // registers of function 7
        info.extend([0x04, 0x37, 0x04, 0x00, 0x81, 0, 0, 0]); // a sized value of another length
        info.extend([0x04, 0x23, 0x08, 0x00, 7, 0, 0, 0, 16, 0, 0, 0]); // its stack
        assert_eq!(attributes(&info), Some(vec![(EIATTR_REGCOUNT, 40), (EIATTR_MAX_STACK_SIZE, 16)]));
        assert_eq!(attributes(&info[..info.len() - 1]), None, "a value past the end");
        assert_eq!(attributes(&[0x09, 0x2f, 0, 0]), None, "an unknown format");
    }

    #[test]
    fn what_is_not_a_cubin_is_refused() {
        assert!(CubinResources::read(b"not an ELF", "k").unwrap_err().contains("not a 64-bit little-endian ELF"));
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[18] = 62; // x86-64
        assert!(CubinResources::read(&elf, "k").unwrap_err().contains("not EM_CUDA"));
        elf[18] = EM_CUDA as u8;
        elf[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[0x3c] = 1;
        elf[0x3a] = 64;
        assert!(CubinResources::read(&elf, "k").unwrap_err().contains("outside the file"));
    }
}
