//! What a page cache holds for one file between two syncs: the writes and truncates a process
//! made, kept in memory over the backing file, which stays as it was at the last sync. A sync
//! applies them to the backing file; a power cut drops them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;

const PAGE: u64 = 4096;

pub struct Overlay {
    /// The size the file has for the processes that use it.
    len: u64,
    /// Bytes of the backing file at or past this offset are gone for those processes (a
    /// truncate not synced yet). Never above `len`.
    low: u64,
    /// Pages written since the last sync, by page number, each `PAGE` bytes. Bytes past `len`
    /// in them are always zero.
    pages: BTreeMap<u64, Box<[u8]>>,
}

impl Overlay {
    /// A clean overlay over a backing file of `backing_len` bytes.
    pub fn new(backing_len: u64) -> Overlay {
        Overlay {
            len: backing_len,
            low: backing_len,
            pages: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes held that the backing file does not have yet (for the test's report).
    pub fn dirty_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    /// Page `n` as the processes see it when no write touched it since the last sync.
    fn base(&self, backing: &File, n: u64) -> io::Result<Box<[u8]>> {
        let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
        let start = n * PAGE;
        let visible = self.low.saturating_sub(start).min(PAGE) as usize;
        let mut filled = 0;
        while filled < visible {
            match backing.read_at(&mut page[filled..visible], start + filled as u64)? {
                0 => break,
                k => filled += k,
            }
        }
        Ok(page)
    }

    pub fn write(&mut self, backing: &File, offset: u64, data: &[u8]) -> io::Result<()> {
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let n = at / PAGE;
            let within = (at - n * PAGE) as usize;
            let take = ((PAGE as usize) - within).min((end - at) as usize);
            if !self.pages.contains_key(&n) {
                let page = self.base(backing, n)?;
                self.pages.insert(n, page);
            }
            let page = self.pages.get_mut(&n).expect("inserted above");
            let from = (at - offset) as usize;
            page[within..within + take].copy_from_slice(&data[from..from + take]);
            at += take as u64;
        }
        self.len = self.len.max(end);
        Ok(())
    }

    pub fn read(&self, backing: &File, offset: u64, size: usize) -> io::Result<Vec<u8>> {
        let end = (offset + size as u64).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let n = at / PAGE;
            let within = (at - n * PAGE) as usize;
            let take = ((PAGE as usize) - within).min((end - at) as usize);
            match self.pages.get(&n) {
                Some(page) => out.extend_from_slice(&page[within..within + take]),
                None => out.extend_from_slice(&self.base(backing, n)?[within..within + take]),
            }
            at += take as u64;
        }
        Ok(out)
    }

    pub fn truncate(&mut self, len: u64) {
        if len < self.len {
            self.pages.retain(|&n, _| n * PAGE < len);
            let n = len / PAGE;
            if let Some(page) = self.pages.get_mut(&n) {
                page[(len - n * PAGE) as usize..].fill(0);
            }
            self.low = self.low.min(len);
        }
        self.len = len;
    }

    /// Make the backing file what the processes see, and sync it: what fsync promises.
    pub fn apply(self, backing: &File) -> io::Result<()> {
        if backing.metadata()?.len() > self.low {
            backing.set_len(self.low)?;
        }
        for (n, page) in &self.pages {
            let start = n * PAGE;
            if start < self.len {
                let keep = (self.len - start).min(PAGE) as usize;
                backing.write_all_at(&page[..keep], start)?;
            }
        }
        backing.set_len(self.len)?;
        backing.sync_data()
    }
}
