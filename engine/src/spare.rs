//! The next segment, prepared ahead ([`crate::NextSegment`]).
//!
//! Creating a segment preallocates it (with [`crate::Preallocate::ZeroFill`], up to
//! 64 MiB of zeros by default), writes its header and fsyncs it. Done by the writer
//! that fills the active segment, that is a long stall on one commit every segment's
//! worth of log. The spare has the capacity the next segment is due
//! ([`crate::Options::segment_bytes_max`]); a roll that needs another (a record larger
//! than that) creates its segment itself and leaves the spare for a later roll.
//! Instead, once the active segment is half full, the spare is built under
//! [`SPARE_SEGMENT_FILE`], which no reader of the log looks at; the writer that needs
//! the next segment renames the spare into place and fsyncs the directory.
//!
//! Crash safety: the spare is complete (zero-filled, header written, fsynced) before it
//! can get a segment's name, and its name is durable (directory fsync) before any
//! record is written into it, so recovery never meets a half-built segment it did not
//! already handle (a crash between create and header, see `scan_log`). A spare left by
//! a crash or a close is removed by the next owner open.

use crate::error::Error;
use crate::format::{self, SEGMENT_HEADER_BYTES};
use crate::segment::Segment;
use crate::types::{Durability, Preallocate};
use crate::vfs::{OpenMode, Vfs, VfsFile};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Name of the spare segment in the store directory (not a `.seg` name: readers and
/// recovery never see it as part of the log).
pub const SPARE_SEGMENT_FILE: &str = "next-segment.spare";

/// A complete spare: preallocated, header for `header_id` written, fsynced.
pub(crate) struct Spare {
    file: Arc<dyn VfsFile>,
    capacity: u64,
    header_id: u64,
}

/// The store's spare slot: the group leader builds and takes the spare; close and
/// `Store::wait_for_spare_segment` wait for a build.
#[derive(Default)]
pub(crate) enum Slot {
    #[default]
    Empty,
    /// Being built on a background thread.
    Building(JoinHandle<Result<Spare, Error>>),
    /// Built, or its building failed (reported to the writer that would use it).
    Done(Result<Spare, Error>),
}

/// What building a spare needs, owned so a thread can take it.
#[derive(Clone)]
pub(crate) struct Plan {
    pub vfs: Arc<dyn Vfs>,
    pub dir: PathBuf,
    pub preallocate: Preallocate,
    pub durability: Durability,
    /// The id the next segment is expected to get (the header is written for it; a
    /// different id at use costs one more header write and fdatasync).
    pub id: u64,
    pub capacity: u64,
}

impl Plan {
    /// Create, preallocate, write the header and fsync the spare file.
    pub fn build(self) -> Result<Spare, Error> {
        debug_assert!(self.capacity >= format::SEGMENT_BYTES_MIN);
        let path = self.dir.join(SPARE_SEGMENT_FILE);
        let file = self
            .vfs
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| Error::io(&path, "create", e))?;
        crate::store::init_segment_file(
            &*file,
            &path,
            self.preallocate.resolve(self.durability),
            self.id,
            self.capacity,
        )?;
        Ok(Spare {
            file,
            capacity: self.capacity,
            header_id: self.id,
        })
    }

    /// Build on a new thread; `None` if no thread could be started. A panic
    /// while building becomes the build's error, naming the spare's path.
    pub fn spawn(self) -> Option<JoinHandle<Result<Spare, Error>>> {
        let path = self.dir.join(SPARE_SEGMENT_FILE);
        std::thread::Builder::new()
            .name("spool-spare".into())
            .spawn(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build()))
                    .unwrap_or_else(|_| Err(panicked(&path)))
            })
            .ok()
    }
}

/// The error of a spare build that panicked.
fn panicked(path: &Path) -> Error {
    Error::io(
        path,
        "build spare segment",
        std::io::Error::other("the spare segment's thread panicked"),
    )
}

impl Slot {
    /// The spare for a segment of `capacity`, waiting for it if it is being built.
    /// `Ok(None)` when there is none of that capacity (a spare of another capacity
    /// stays). A failed build is returned once as the error and leaves the slot empty.
    pub fn take(&mut self, capacity: u64) -> Result<Option<Spare>, Error> {
        self.finish();
        match std::mem::take(self) {
            Slot::Done(Ok(s)) if s.capacity == capacity => Ok(Some(s)),
            Slot::Done(Err(e)) => Err(e),
            // Empty, or a spare of another capacity, which stays.
            other => {
                *self = other;
                Ok(None)
            }
        }
    }

    /// Wait for a build in progress (close, `Store::wait_for_spare_segment`, and
    /// `take`).
    pub fn finish(&mut self) {
        // A built spare (or a failed build's error) stays in the slot.
        *self = match std::mem::take(self) {
            // The thread catches a build's panic; this is only for a panic
            // outside it.
            Slot::Building(h) => Slot::Done(
                h.join()
                    .unwrap_or_else(|_| Err(panicked(Path::new(SPARE_SEGMENT_FILE)))),
            ),
            other => other,
        };
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Slot::Empty)
    }

    /// Drop a built spare whose capacity is not `capacity`, removing its file, so one
    /// of the capacity now due can be built: segments grow, and a roll sized for a
    /// large record passes the spare by. If the file cannot be removed the spare stays
    /// (a new build could not create its file).
    pub fn discard_unless(&mut self, capacity: u64, vfs: &dyn Vfs, dir: &Path) {
        if matches!(self, Slot::Done(Ok(s)) if s.capacity != capacity) && remove(vfs, dir).is_ok() {
            *self = Slot::Empty;
        }
    }
}

/// Make `spare` segment `id` of the log in `dir`: its header names `id` and is
/// durable, then the rename, then the directory fsync (after which records may be
/// written into it).
pub(crate) fn install(
    vfs: &dyn Vfs,
    dir: &Path,
    spare: Spare,
    id: u64,
) -> Result<Arc<Segment>, Error> {
    let name = format::segment_file_name(id);
    let path = dir.join(&name);
    let from = dir.join(SPARE_SEGMENT_FILE);
    // A rename replaces its target silently: make sure there is none (only the owner
    // creates segment files, so nothing can appear in between).
    if vfs
        .exists(&path)
        .map_err(|e| Error::io(&path, "exists", e))?
    {
        return Err(Error::io(
            &path,
            "rename spare segment",
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    if spare.header_id != id {
        spare
            .file
            .write_at(&format::encode_header(id), 0)
            .map_err(|e| Error::io(&from, "write_at", e))?;
        spare
            .file
            .sync_data()
            .map_err(|e| Error::io(&from, "sync_data", e))?;
    }
    vfs.rename(&from, &path)
        .map_err(|e| Error::io(&from, "rename", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, "sync_dir", e))?;
    Ok(Arc::new(
        Segment::new(id, spare.file, SEGMENT_HEADER_BYTES, spare.capacity, 0).at(path),
    ))
}

/// Remove a spare left in `dir` (owner open and close). Its absence is not an error.
pub(crate) fn remove(vfs: &dyn Vfs, dir: &Path) -> Result<(), Error> {
    let path = dir.join(SPARE_SEGMENT_FILE);
    match vfs.remove(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, "remove", e)),
    }
}
