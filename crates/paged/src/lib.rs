//! Arrays whose first part may be a saved view's file, mapped copy-on-write.
//!
//! A view read back at start is not decoded: its file is mapped privately
//! ([`Mapping::open`]) and each array of fixed-size values ([`Paged`]) begins in it. Reading
//! brings the file's pages in as they are touched, from the page cache (which the kernel may
//! evict and read again, so a view larger than memory is served). Changing a value copies its
//! page alone into the process (the kernel's copy-on-write); values added past the file's go
//! to an ordinary vector. The file is never written through a mapping, and saved views are
//! only ever replaced by a rename, so a mapped file never changes under it.

use std::sync::Arc;

use bytemuck::Pod;

/// A saved view's file, mapped privately: writes stay in this process.
pub struct Mapping {
    /// Taken once, before the map is shared: every [`Paged`] writes through its own range.
    ptr: *mut u8,
    len: usize,
    /// The byte ranges given to a [`Paged`] so far: no two may overlap.
    claimed: std::sync::Mutex<Vec<(usize, usize)>>,
    _map: memmap2::MmapMut,
    #[cfg(test)]
    file: std::fs::File,
}

// SAFETY: the mapping is only reached through `bytes` (while a view is read back, before any
// `Paged` of it exists) and through `Paged`s of disjoint ranges, each under Rust's own
// borrowing rules.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapping({} bytes)", self.len)
    }
}

impl Mapping {
    /// Map `file` copy-on-write.
    pub fn open(file: &std::fs::File) -> std::io::Result<Arc<Mapping>> {
        // SAFETY: saved views are written to a temporary file and renamed into place; no
        // process writes or truncates a file in place once it has that name.
        let mut map = unsafe { memmap2::MmapOptions::new().map_copy(file)? };
        Ok(Arc::new(Mapping {
            ptr: map.as_mut_ptr(),
            len: map.len(),
            claimed: std::sync::Mutex::new(Vec::new()),
            _map: map,
            #[cfg(test)]
            file: file.try_clone()?,
        }))
    }

    /// The file's bytes, for reading it back. Not to be held once a [`Paged`] of this mapping
    /// may be written.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` are the live map's, which this owns.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Give bytes `at..end` to one array; `false` when some of them were given already.
    fn claim(&self, at: usize, end: usize) -> bool {
        if at == end {
            return true;
        }
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        if claimed.iter().any(|&(a, e)| at < e && a < end) {
            return false;
        }
        claimed.push((at, end));
        true
    }

    /// Tell the kernel that pages will be read in no order (queries), so that a fault reads
    /// one page, not the ones after it.
    pub fn read_at_random(&self) {
        let _ = self._map.advise(memmap2::Advice::Random);
    }
}

/// Values indexed by position: the first `base_len` in a [`Mapping`], the rest in `tail`.
pub struct Paged<T: Pod> {
    base: *mut T,
    base_len: usize,
    /// Keeps the mapping alive while `base` points into it.
    _map: Option<Arc<Mapping>>,
    tail: Vec<T>,
}

// SAFETY: a `Paged` owns its range of the mapping alone (see `Paged::mapped`), so it is as
// sendable and shareable as a `Vec<T>`.
unsafe impl<T: Pod + Send> Send for Paged<T> {}
unsafe impl<T: Pod + Sync> Sync for Paged<T> {}

impl<T: Pod> Default for Paged<T> {
    fn default() -> Paged<T> {
        Paged::from_vec(Vec::new())
    }
}

impl<T: Pod> Clone for Paged<T> {
    fn clone(&self) -> Paged<T> {
        Paged::from_vec(self.iter().copied().collect())
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for Paged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Paged({} mapped, {} owned)",
            self.base_len,
            self.tail.len()
        )
    }
}

impl<T: Pod> Paged<T> {
    pub fn from_vec(tail: Vec<T>) -> Paged<T> {
        Paged {
            base: std::ptr::NonNull::dangling().as_ptr(),
            base_len: 0,
            _map: None,
            tail,
        }
    }

    /// `len` values of `map` from byte `at`; `Err` when the range is outside the mapping,
    /// not aligned for `T`, or overlaps a range another `Paged` was given (each range is
    /// written by one array alone).
    pub fn mapped(map: &Arc<Mapping>, at: usize, len: usize) -> Result<Paged<T>, String> {
        let end = len
            .checked_mul(size_of::<T>())
            .and_then(|b| at.checked_add(b))
            .filter(|end| *end <= map.len)
            .ok_or("truncated (an array past the end of its file)")?;
        // SAFETY: `at` is within the mapping (checked above).
        let base = unsafe { map.ptr.add(at) };
        if !(base as usize).is_multiple_of(align_of::<T>()) {
            return Err("damaged (an array out of alignment)".into());
        }
        if !map.claim(at, end) {
            return Err("damaged (two arrays share bytes)".into());
        }
        Ok(Paged {
            base: base.cast(),
            base_len: len,
            _map: Some(map.clone()),
            tail: Vec::new(),
        })
    }

    /// Whether some values are in a mapped file.
    pub fn is_mapped(&self) -> bool {
        self.base_len > 0
    }

    #[inline]
    fn base(&self) -> &[T] {
        // SAFETY: `base..base + base_len` is this value's own range of a live mapping (or
        // empty, with a dangling aligned pointer), valid for any bit pattern since `T: Pod`.
        unsafe { std::slice::from_raw_parts(self.base, self.base_len) }
    }

    #[inline]
    fn base_mut(&mut self) -> &mut [T] {
        // SAFETY: as `base`; `&mut self` makes this the range's only reference.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.base_len) }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.base_len + self.tail.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        if i < self.base_len {
            Some(&self.base()[i])
        } else {
            self.tail.get(i - self.base_len)
        }
    }

    #[inline]
    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i < self.base_len {
            Some(&mut self.base_mut()[i])
        } else {
            let at = i - self.base_len;
            self.tail.get_mut(at)
        }
    }

    pub fn push(&mut self, v: T) {
        self.tail.push(v);
    }

    /// Grow to (or cut to) `n` values, new ones `v`. Cutting into the mapped part copies the
    /// rest out of it.
    pub fn resize(&mut self, n: usize, v: T) {
        if n >= self.base_len {
            self.tail.resize(n - self.base_len, v);
        } else {
            let kept = self.base()[..n].to_vec();
            *self = Paged::from_vec(kept);
        }
    }

    pub fn reserve(&mut self, more: usize) {
        self.tail.reserve(more);
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.base().iter().chain(self.tail.iter())
    }

    /// The values as one slice, for values all mapped or all owned (tables read back whole
    /// and never added to); otherwise only the mapped ones.
    pub fn as_slice(&self) -> &[T] {
        debug_assert!(self.base_len == 0 || self.tail.is_empty());
        if self.base_len > 0 {
            self.base()
        } else {
            &self.tail
        }
    }
}

impl<T: Pod> std::ops::Index<usize> for Paged<T> {
    type Output = T;
    #[inline]
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(v) => v,
            None => panic!("index {i} past {} values", self.len()),
        }
    }
}

impl<T: Pod> std::ops::IndexMut<usize> for Paged<T> {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut T {
        let len = self.len();
        match self.get_mut(i) {
            Some(v) => v,
            None => panic!("index {i} past {len} values"),
        }
    }
}

/// Text of a mapping, checked once to be UTF-8 and never changed.
#[derive(Debug, Default)]
pub struct MappedStr(Paged<u8>);

impl MappedStr {
    /// `len` bytes of `map` from byte `at`; `Err` when they are not UTF-8 (or not there).
    pub fn mapped(map: &Arc<Mapping>, at: usize, len: usize) -> Result<MappedStr, String> {
        let bytes: Paged<u8> = Paged::mapped(map, at, len)?;
        std::str::from_utf8(bytes.base()).map_err(|_| "a string is not UTF-8".to_string())?;
        Ok(MappedStr(bytes))
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        // SAFETY: checked to be UTF-8 in `mapped` (or empty); nothing can write it since.
        unsafe { std::str::from_utf8_unchecked(self.0.base()) }
    }
}

/// `n` rounded up to a multiple of eight: where the next array of a saved file starts.
pub fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Zeros up to the next multiple of eight.
pub fn pad8(w: &mut Vec<u8>) {
    w.resize(align8(w.len()), 0);
}

/// The little-endian `u64` at byte `at` of `b` (a saved file's header field).
pub fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    at.checked_add(8)
        .and_then(|end| b.get(at..end))
        .map(|x| u64::from_le_bytes(x.try_into().expect("8 bytes")))
        .ok_or_else(|| "truncated (a header)".to_string())
}

/// [`u64_at`] as a count or offset of this machine.
pub fn usize_at(b: &[u8], at: usize) -> Result<usize, String> {
    usize::try_from(u64_at(b, at)?).map_err(|_| "damaged (a count too large)".to_string())
}

/// `bytes` in a temporary file, mapped (for tests). The file is removed at once: the
/// mapping keeps its pages.
pub fn mapped_for_test(bytes: &[u8]) -> Arc<Mapping> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "geoshard-paged-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).expect("a temporary file");
    let file = std::fs::File::open(&path).expect("a temporary file");
    let _ = std::fs::remove_file(&path);
    Mapping::open(&file).expect("a mapping")
}

#[cfg(test)]
mod tests {
    use super::*;
    use mapped_for_test as mapped;

    #[test]
    fn mapped_values_read_change_and_grow_without_touching_the_file() {
        let values: Vec<u32> = (0..5000).collect();
        let mut bytes = vec![0u8; 8];
        bytes.extend_from_slice(bytemuck::cast_slice(&values));
        let map = mapped(&bytes);
        let mut p: Paged<u32> = Paged::mapped(&map, 8, 5000).unwrap();
        assert!(p.is_mapped());
        assert_eq!((p[0], p[4999], p.len()), (0, 4999, 5000));
        p[10] = 77;
        p.push(5000);
        p.resize(5003, 9);
        assert_eq!((p[10], p[5000], p[5002], p.len()), (77, 5000, 9, 5003));
        assert_eq!(p.get(5003), None);
        let sum: u64 = p.iter().map(|&v| u64::from(v)).sum();
        assert_eq!(sum, (0..5000u64).sum::<u64>() - 10 + 77 + 5000 + 18);
        // The change stayed in this process: a second mapping of the file sees what it held.
        let again = Mapping::open(&map.file).unwrap();
        assert_eq!(again.bytes(), &bytes[..]);
        // Cut into the mapped part: the rest is copied out.
        p.resize(3, 0);
        assert!(!p.is_mapped());
        assert_eq!(p.iter().copied().collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn ranges_outside_the_file_or_out_of_alignment_are_refused() {
        let map = mapped(&[0u8; 64]);
        assert!(Paged::<u64>::mapped(&map, 8, 7).is_ok());
        assert!(Paged::<u64>::mapped(&map, 8, 8).is_err());
        assert!(Paged::<u64>::mapped(&map, 4, 1).is_err());
        assert!(Paged::<u64>::mapped(&map, usize::MAX - 3, 1).is_err());
        assert!(Paged::<u8>::mapped(&map, 64, 0).is_ok());
    }

    #[test]
    fn no_two_arrays_share_bytes() {
        let map = mapped(&[0u8; 64]);
        let _a = Paged::<u32>::mapped(&map, 8, 2).unwrap();
        assert!(Paged::<u8>::mapped(&map, 15, 1).is_err());
        assert!(Paged::<u64>::mapped(&map, 0, 2).is_err());
        assert!(Paged::<u8>::mapped(&map, 16, 8).is_ok());
        assert!(Paged::<u8>::mapped(&map, 0, 8).is_ok());
        assert!(Paged::<u8>::mapped(&map, 12, 0).is_ok());
    }

    #[test]
    fn mapped_text_is_checked_once() {
        let map = mapped(b"h\xc3\xa9llo\x00\xff");
        assert_eq!(MappedStr::mapped(&map, 0, 6).unwrap().as_str(), "héllo");
        let bad = mapped(&[b'a', 0xff, b'b']);
        assert!(MappedStr::mapped(&bad, 0, 3).is_err());
        assert_eq!(u64_at(&[1, 0, 0, 0, 0, 0, 0, 0, 9], 0), Ok(1));
        assert!(u64_at(&[1, 0, 0], 0).is_err());
        assert!(u64_at(&[0; 8], usize::MAX).is_err());
        assert_eq!((align8(0), align8(1), align8(8), align8(9)), (0, 8, 8, 16));
    }
}
