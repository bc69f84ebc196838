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
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{BackgroundSession, Config, Errno, FileAttr, FileType, INodeNo, MountOption};
use parking_lot::Mutex;

use super::fuse_ops::Fs;
use super::overlay::Overlay;

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

pub(super) struct State {
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) by_path: HashMap<PathBuf, u64>,
    next: u64,
    pub(super) powered: bool,
}

pub(super) struct Node {
    pub(super) path: PathBuf,
    /// The backing file, opened at the first open through the mount and kept: an overlay is
    /// read through and applied to it, also after an unlink.
    pub(super) file: Option<Arc<File>>,
    pub(super) overlay: Option<Overlay>,
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
    pub(super) fn intern(&mut self, path: PathBuf) -> u64 {
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

    pub(super) fn node(&mut self, ino: INodeNo) -> Result<&mut Node, Errno> {
        self.nodes.get_mut(&ino.0).ok_or(Errno::ENOENT)
    }

    pub(super) fn child(&mut self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.node(parent)?.path.join(name))
    }

    pub(super) fn attr(&mut self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let meta = match &node.file {
            Some(f) => f.metadata(),
            None => std::fs::symlink_metadata(&node.path),
        }
        .map_err(Errno::from)?;
        Ok(attr(ino, &meta, node.overlay.as_ref().map(Overlay::len)))
    }

    pub(super) fn entry(&mut self, path: PathBuf) -> Result<FileAttr, Errno> {
        std::fs::symlink_metadata(&path).map_err(Errno::from)?;
        let ino = self.intern(path);
        self.attr(ino)
    }

    pub(super) fn file(&mut self, ino: INodeNo) -> Result<Arc<File>, Errno> {
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
    pub(super) fn overlay(&mut self, ino: INodeNo) -> Result<(&mut Overlay, Arc<File>), Errno> {
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
