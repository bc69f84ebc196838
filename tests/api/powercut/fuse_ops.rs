//! The FUSE requests of [`super::lazyfs::LazyFs`]: lookups and metadata go to the backing
//! directory, data reads and writes to the file's overlay, `fsync` applies the overlay.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use parking_lot::Mutex;

use super::lazyfs::State;
use super::overlay::Overlay;

/// `O_EXCL` on Linux (every architecture).
const O_EXCL: i32 = 0o200;

/// Attributes are never cached by the kernel: sizes come from the overlays.
const TTL: Duration = Duration::ZERO;

/// The `fuser` side: one request at a time (one session thread), all state behind one lock.
pub(super) struct Fs(pub(super) Arc<Mutex<State>>);

impl Filesystem for Fs {
    fn lookup(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.0.lock();
        match st.child(parent, name).and_then(|p| st.entry(p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _: &Request, ino: INodeNo, _: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.lock().attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _: Option<u32>,
        _: Option<u32>,
        size: Option<u64>,
        _: Option<fuser::TimeOrNow>,
        _: Option<fuser::TimeOrNow>,
        _: Option<SystemTime>,
        _: Option<FileHandle>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<SystemTime>,
        _: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.0.lock();
        let result = (|| {
            if let Some(mode) = mode {
                let path = st.node(ino)?.path.clone();
                let perms = std::fs::Permissions::from_mode(mode & 0o7777);
                std::fs::set_permissions(path, perms).map_err(Errno::from)?;
            }
            if let Some(size) = size {
                st.overlay(ino)?.0.truncate(size);
            }
            st.attr(ino.0)
        })();
        match result {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.0.lock();
        let result = st.child(parent, name).and_then(|path| {
            std::fs::create_dir(&path).map_err(Errno::from)?;
            let perms = std::fs::Permissions::from_mode(mode & !umask & 0o7777);
            std::fs::set_permissions(&path, perms).map_err(Errno::from)?;
            st.entry(path)
        });
        match result {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.0.lock();
        let result = st.child(parent, name).and_then(|path| {
            let exclusive = flags & O_EXCL != 0;
            let file = File::options()
                .read(true)
                .write(true)
                .create(!exclusive)
                .create_new(exclusive)
                .mode(mode & !umask & 0o7777)
                .open(&path)
                .map_err(Errno::from)?;
            let ino = st.intern(path);
            st.nodes.get_mut(&ino).expect("interned").file = Some(Arc::new(file));
            st.attr(ino)
        });
        match result {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.0.lock();
        let result = st.child(parent, name).and_then(|path| {
            std::fs::remove_file(&path).map_err(Errno::from)?;
            st.by_path.remove(&path);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.0.lock();
        let result = st.child(parent, name).and_then(|path| {
            std::fs::remove_dir(&path).map_err(Errno::from)?;
            st.by_path.remove(&path);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Renames a file (SQLite renames nothing; a renamed directory's children keep stale paths).
    fn rename(
        &self,
        _: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.0.lock();
        let result = (|| {
            let (from, to) = (st.child(parent, name)?, st.child(newparent, newname)?);
            std::fs::rename(&from, &to).map_err(Errno::from)?;
            st.by_path.remove(&to);
            if let Some(ino) = st.by_path.remove(&from) {
                st.by_path.insert(to.clone(), ino);
                st.nodes.get_mut(&ino).expect("mapped").path = to;
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _: &Request, ino: INodeNo, _: OpenFlags, reply: ReplyOpen) {
        match self.0.lock().file(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        size: u32,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.0.lock();
        let result = st.file(ino).and_then(|file| {
            let data = match &st.node(ino)?.overlay {
                Some(overlay) => overlay.read(&file, offset, size as usize),
                None => file
                    .metadata()
                    .and_then(|m| Overlay::new(m.len()).read(&file, offset, size as usize)),
            };
            data.map_err(Errno::from)
        });
        match result {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        data: &[u8],
        _: WriteFlags,
        _: OpenFlags,
        _: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.0.lock();
        let result = st
            .overlay(ino)
            .and_then(|(overlay, file)| overlay.write(&file, offset, data).map_err(Errno::from));
        match result {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    /// The one way data reaches the backing directory.
    fn fsync(&self, _: &Request, ino: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        let mut st = self.0.lock();
        let result = (|| {
            if !st.powered {
                return Err(Errno::EIO);
            }
            let file = st.file(ino)?;
            match st.node(ino)?.overlay.take() {
                Some(overlay) => overlay.apply(&file).map_err(Errno::from),
                None => Ok(()),
            }
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Directory entries are durable at once in this model.
    fn fsyncdir(&self, _: &Request, _: INodeNo, _: FileHandle, _: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn readdir(
        &self,
        _: &Request,
        ino: INodeNo,
        _: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut st = self.0.lock();
        let result = (|| {
            let dir = st.node(ino)?.path.clone();
            let mut entries = vec![
                (ino.0, FileType::Directory, ".".into()),
                (ino.0, FileType::Directory, "..".into()),
            ];
            for entry in std::fs::read_dir(&dir).map_err(Errno::from)? {
                let entry = entry.map_err(Errno::from)?;
                let kind = match entry.file_type().map_err(Errno::from)? {
                    t if t.is_dir() => FileType::Directory,
                    t if t.is_symlink() => FileType::Symlink,
                    _ => FileType::RegularFile,
                };
                entries.push((st.intern(entry.path()), kind, entry.file_name()));
            }
            Ok::<_, Errno>(entries)
        })();
        match result {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize)
                {
                    if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }
}
