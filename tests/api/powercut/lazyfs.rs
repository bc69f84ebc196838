//! A FUSE passthrough filesystem that loses what was not synced, as LazyFS does: every data
//! write and truncate of a file stays in an in-memory [`Overlay`] until `fsync`/`fdatasync` of
//! that file applies it to the backing directory (and syncs it there); [`LazyFs::cut`] drops
//! every overlay, and after it nothing reaches the backing directory any more. What remains in
//! the backing directory is then what a disk would hold after a power cut.
//!
//! Metadata (create, mkdir, unlink, rename) goes straight to the backing directory, as if the
//! filesystem journaled it at once: the model is about file data, which is where SQLite's
//! durability lives. No `direct_io`: SQLite maps its `-shm` file shared, through the kernel's
//! page cache. No lock handler: the kernel keeps POSIX locks locally, right for one process.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};
use parking_lot::Mutex;

use super::overlay::Overlay;

/// `O_EXCL` on Linux (every architecture).
const O_EXCL: i32 = 0o200;

/// Attributes are never cached by the kernel: sizes come from the overlays.
const TTL: Duration = Duration::ZERO;

/// A mounted filesystem; dropping it unmounts.
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

/// What [`LazyFs::cut`] dropped: unsynced bytes (whole pages) per file name.
#[derive(Debug)]
pub struct Cut(pub Vec<(String, u64)>);

impl LazyFs {
    /// Mount over `backing` at `mountpoint` (both existing directories). The error says why a
    /// FUSE mount is impossible here.
    pub fn mount(backing: &Path, mountpoint: &Path) -> Result<LazyFs, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse does not exist".into());
        }
        let state = Arc::new(Mutex::new(State::new(backing.to_path_buf())));
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("powercut".into())];
        let fs = Fs(Arc::clone(&state));
        let session = fuser::spawn_mount(fs, mountpoint, &config)
            .map_err(|e| format!("mounting FUSE at {}: {e}", mountpoint.display()))?;
        Ok(LazyFs {
            state,
            session: Some(session),
        })
    }

    /// Power off: drop every write not synced yet; from now on writes and syncs fail.
    pub fn cut(&self) -> Cut {
        let mut st = self.state.lock();
        st.powered = false;
        let State { nodes, by_path, .. } = &mut *st;
        // Files unlinked since (a `-shm` a closed process removed) are not counted.
        let mut dropped: Vec<(String, u64)> = nodes
            .iter_mut()
            .filter_map(|(ino, node)| {
                let overlay = node.overlay.take()?;
                (by_path.get(&node.path) == Some(ino)).then_some(())?;
                let name = node.path.file_name()?.to_string_lossy().into_owned();
                Some((name, overlay.dirty_bytes()))
            })
            .collect();
        dropped.sort();
        Cut(dropped)
    }

    /// Unmount and wait for the filesystem's thread.
    pub fn unmount(mut self) {
        if let Some(session) = self.session.take() {
            session
                .umount_and_join()
                .expect("unmount the power-cut filesystem");
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

struct State {
    nodes: HashMap<u64, Node>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
    powered: bool,
}

struct Node {
    path: PathBuf,
    /// The backing file, opened at the first open through the mount and kept: an overlay is
    /// read through and applied to it, also after an unlink.
    file: Option<Arc<File>>,
    overlay: Option<Overlay>,
}

impl State {
    fn new(root: PathBuf) -> State {
        let mut st = State {
            nodes: HashMap::new(),
            by_path: HashMap::new(),
            next: INodeNo::ROOT.0,
            powered: true,
        };
        st.intern(root);
        st
    }

    /// The inode number of a backing path, assigned on first sight.
    fn intern(&mut self, path: PathBuf) -> u64 {
        if let Some(&ino) = self.by_path.get(&path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(path.clone(), ino);
        let node = Node {
            path,
            file: None,
            overlay: None,
        };
        self.nodes.insert(ino, node);
        ino
    }

    fn node(&mut self, ino: INodeNo) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)
    }

    fn child(&mut self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.node(parent)?.path.join(name))
    }

    fn attr(&mut self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let meta = match &node.file {
            Some(f) => f.metadata(),
            None => std::fs::symlink_metadata(&node.path),
        }
        .map_err(Errno::from)?;
        Ok(attr(ino, &meta, node.overlay.as_ref().map(Overlay::len)))
    }

    fn entry(&mut self, path: PathBuf) -> Result<FileAttr, Errno> {
        std::fs::symlink_metadata(&path).map_err(Errno::from)?;
        let ino = self.intern(path);
        self.attr(ino)
    }

    fn file(&mut self, ino: INodeNo) -> Result<Arc<File>, Errno> {
        let node = self.node(ino)?;
        if node.file.is_none() {
            let f = File::options()
                .read(true)
                .write(true)
                .open(&node.path)
                .map_err(Errno::from)?;
            node.file = Some(Arc::new(f));
        }
        Ok(Arc::clone(node.file.as_ref().expect("opened above")))
    }

    /// The overlay of a file, made clean over the backing file if it has none.
    fn overlay(&mut self, ino: INodeNo) -> Result<(&mut Overlay, Arc<File>), Errno> {
        if !self.powered {
            return Err(Errno::EIO);
        }
        let file = self.file(ino)?;
        let len = file.metadata().map_err(Errno::from)?.len();
        let node = self.node(ino)?;
        Ok((node.overlay.get_or_insert_with(|| Overlay::new(len)), file))
    }
}

fn attr(ino: u64, meta: &Metadata, len: Option<u64>) -> FileAttr {
    let time = |secs: i64, nanos: i64| {
        UNIX_EPOCH + Duration::new(secs.max(0) as u64, nanos.clamp(0, 999_999_999) as u32)
    };
    let size = len.unwrap_or(meta.len());
    let kind = if meta.is_dir() {
        FileType::Directory
    } else if meta.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: (meta.mode() & 0o7777) as u16,
        nlink: meta.nlink() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The `fuser` side: one request at a time (one session thread), all state behind one lock.
struct Fs(Arc<Mutex<State>>);

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
