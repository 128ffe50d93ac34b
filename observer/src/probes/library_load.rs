//! Probes on the loader's `dlopen` and `dlmopen` in each libc (and, for
//! glibc before 2.34, libdl) file processes map, once per file: the host's
//! and each container image's own. A failed load comes back as a record;
//! which files to probe is discovery's to say.
use std::{collections::HashMap, path::Path};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use observer_common::library_load::{DLOPEN_EXIT_PROGRAM, LOADER_FUNCTIONS};

use super::table::AttachError;
use crate::gpu_library::FileId;

/// Whether a file name is a loader library whose `dlopen` is probed.
pub fn is_loader_library(name: &str) -> bool {
    name.starts_with("libc.so.6") || name.starts_with("libdl.so.2")
}

/// What each loader file got: the functions probed, or why none.
#[derive(Default)]
pub struct LoaderProbes {
    files: HashMap<FileId, Result<usize, String>>,
    loaded: bool,
}

impl LoaderProbes {
    pub fn is_handled(&self, id: &FileId) -> bool {
        self.files.contains_key(id)
    }

    /// Files probed and how many functions each, for `check`'s statuses.
    pub fn outcomes(&self) -> impl Iterator<Item = (&FileId, &Result<usize, String>)> {
        self.files.iter()
    }

    /// Probes the loader functions `path` defines (glibc 2.34+'s libdl
    /// defines none: its `dlopen` is libc's). Returns how many.
    pub fn attach(&mut self, ebpf: &mut Ebpf, id: FileId, path: &Path) -> Result<usize, AttachError> {
        if !self.loaded {
            for (_, program) in LOADER_FUNCTIONS.iter().chain([&("", DLOPEN_EXIT_PROGRAM)]) {
                program_mut(ebpf, program)?.load().map_err(AttachError::Load)?;
            }
            self.loaded = true;
        }
        let mut attached = 0;
        let mut first_error = None;
        for (function, entry) in LOADER_FUNCTIONS {
            // The return program first: a return without its entry sees
            // nothing, an entry without its return would note names for
            // nothing to read.
            let result = attach_at(ebpf, DLOPEN_EXIT_PROGRAM, function, path)
                .and_then(|()| attach_at(ebpf, entry, function, path));
            match result {
                Ok(()) => attached += 1,
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match (attached, first_error) {
            (0, Some(e)) => {
                self.files.insert(id, Err(e.to_string()));
                Err(e)
            }
            _ => {
                self.files.insert(id, Ok(attached));
                Ok(attached)
            }
        }
    }
}

fn program_mut<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut UProbe, AttachError> {
    let found = ebpf.program_mut(program).ok_or(AttachError::MissingProgram(program))?;
    found.try_into().map_err(|source| AttachError::WrongType { program, expected: "uprobe", source })
}

fn attach_at(ebpf: &mut Ebpf, program: &'static str, function: &str, path: &Path) -> Result<(), AttachError> {
    let point = UProbeAttachPoint { location: UProbeAttachLocation::Symbol(function), cookie: None };
    program_mut(ebpf, program)?
        .attach(point, path, UProbeScope::AllProcesses)
        .map(|_| ())
        .map_err(AttachError::Attach)
}
