//! What the kernel under test offers canaryscope, as the test matrix
//! declares it (`VM_BOOTS` and the host's entry in `xtask/src/test.rs`),
//! never as the code under test reads it. A wrong helper table or BTF
//! reading in the observer would move an expectation computed from it along
//! with the bug; a declaration written per kernel does not move. Backported
//! features make a version number a poor oracle, so the declaration names
//! features, not versions.

/// The features of one kernel that decide which shape a probe family takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelShape {
    /// `bpf_get_attach_cookie` (5.15): one program serves every GPU
    /// function; without it, a program pair per function.
    pub attach_cookies: bool,
    /// `bpf_find_vma` and friends (5.17): crashes read in the kernel;
    /// without them, the fallback on `signal_generate`.
    pub find_vma: bool,
    /// `mm_struct.mm_rb` (before 6.1's maple tree): the crash fallback walks
    /// the process's tree of mappings at the fault itself.
    pub mapping_tree: bool,
    /// `BPF_LINK_TYPE_UPROBE_MULTI` (6.6): one link per program and file.
    pub uprobe_multi: bool,
}

/// The variable `cargo xtask test` sets for the host and each VM boot.
pub const SHAPE_VAR: &str = "CANARYSCOPE_KERNEL_SHAPE";

const FEATURES: [&str; 4] = ["attach_cookies", "find_vma", "mapping_tree", "uprobe_multi"];

impl KernelShape {
    /// Parses the declared list, e.g. `attach_cookies,find_vma`; an
    /// unknown word is an error, so a typo cannot silently declare less.
    pub fn parse(text: &str) -> Result<Self, String> {
        let words: Vec<&str> = text.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
        if let Some(unknown) = words.iter().find(|w| !FEATURES.contains(w)) {
            return Err(format!("unknown kernel feature {unknown:?} (known: {FEATURES:?})"));
        }
        let has = |f: &str| words.contains(&f);
        Ok(Self {
            attach_cookies: has("attach_cookies"),
            find_vma: has("find_vma"),
            mapping_tree: has("mapping_tree"),
            uprobe_multi: has("uprobe_multi"),
        })
    }

    /// The shape declared for the kernel the tests run on.
    pub fn declared() -> Self {
        let text = std::env::var(SHAPE_VAR).unwrap_or_else(|_| {
            panic!(
                "{SHAPE_VAR} is not set: run through `cargo xtask test`, which declares each kernel's \
                 features, or set it by hand (e.g. {SHAPE_VAR}=attach_cookies,find_vma,uprobe_multi)"
            )
        });
        Self::parse(&text).unwrap_or_else(|e| panic!("{SHAPE_VAR}={text:?}: {e}"))
    }
}
