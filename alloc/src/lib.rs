//! mimalloc as the global allocator, by its plain calls (`mi_malloc`, `mi_zalloc`,
//! `mi_realloc`) wherever they already give the alignment asked for.
//!
//! The `mimalloc` crate's allocator passes every request to the `_aligned` calls. In mimalloc
//! v3 those take a fast path only for small blocks whose next free block happens to sit at the
//! alignment. Otherwise they fall back to a generic path, which over-allocates by the
//! alignment unless the size class is a power of two. In geoshard's request path that was
//! about three over-allocations a request, and 1,654 instructions of allocation a request
//! against 1,066 by the plain calls (callgrind, pip-counties). The upstream crate has an open
//! change for the same thing (purpleprotocol/mimalloc_rust#170).
//!
//! mimalloc's plain calls return blocks aligned to 16 bytes, or to 8 for the 8-byte class.
//! This allocator does not rely on that: it checks each plain block's address, and in the
//! case that should never happen it frees the block and asks the `_aligned` call instead.
//! The check is one AND and one branch.
//!
//! [`collect`] returns the calling thread's free pages to the OS, for threads that fall idle
//! after a burst of allocation.

#![no_std]

extern crate alloc;

use alloc::alloc::handle_alloc_error;
use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use libmimalloc_sys as mi;

/// The largest alignment tried by a plain call (`MI_MAX_ALIGN_SIZE` on 64-bit targets).
const PLAIN_ALIGN: usize = 16;

/// mimalloc, by its plain calls where the layout allows.
pub struct MiMalloc;

/// A layout a plain call can serve: a small alignment that divides the size (Rust types
/// always have a size that is a multiple of their alignment).
#[inline(always)]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && size & (align - 1) == 0
}

#[inline(always)]
fn aligned(p: *mut c_void, align: usize) -> bool {
    (p as usize) & (align - 1) == 0
}

/// A block from `plain_call` when the layout allows it and the block is at the alignment,
/// else from `aligned_call`.
///
/// # Safety
///
/// The two calls must be mimalloc's allocating calls (or behave as they do).
#[inline(always)]
unsafe fn block(
    layout: Layout,
    plain_call: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned_call: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    let (size, align) = (layout.size(), layout.align());
    if plain(align, size) {
        // SAFETY: an allocating call; any size is accepted.
        let p = unsafe { plain_call(size) };
        if aligned(p, align) {
            return p.cast();
        }
        // SAFETY: `p` came from mimalloc just now.
        unsafe { mi::mi_free(p) };
    }
    // SAFETY: `align` is a power of two (a `Layout` guarantees it).
    unsafe { aligned_call(size, align).cast() }
}

// SAFETY: every block comes from mimalloc and goes back to it. `mi_free` and `mi_realloc`
// accept blocks from the `_aligned` calls too (mimalloc finds the block's start itself), so
// blocks from either path can be freed and resized alike. Plain blocks are returned only at
// the alignment asked for (checked), and null is returned only when mimalloc returns null.
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocating calls take any size and a power-of-two alignment.
        unsafe { block(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { block(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a block this allocator gave out.
        unsafe { mi::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        if plain(align, new_size) {
            // SAFETY: the caller passes a live block of this allocator; mi_realloc moves its
            // contents (up to the smaller size) and frees it when it moves.
            let p = unsafe { mi::mi_realloc(ptr.cast(), new_size) };
            if aligned(p, align) {
                return p.cast();
            }
            // Never expected: the contents are in `p` now, at the wrong alignment. Move them
            // to a block at the right one. `ptr` may be gone already, so a failure here
            // cannot be answered with null (which promises the old block is intact): it is
            // an allocation error.
            // SAFETY: `p` is a live block of at least `new_size` bytes; `q` is a fresh one.
            unsafe {
                let q = mi::mi_malloc_aligned(new_size, align);
                if q.is_null() {
                    handle_alloc_error(Layout::from_size_align(new_size, align).unwrap_or(layout));
                }
                core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), new_size);
                mi::mi_free(p);
                return q.cast();
            }
        }
        // SAFETY: as above, by the aligned call.
        unsafe { mi::mi_realloc_aligned(ptr.cast(), new_size, align).cast() }
    }
}

/// Return the calling thread's freed memory to the OS (`mi_collect(true)`).
///
/// mimalloc gives free pages back only from the thread that owns them, when that thread
/// allocates again. A thread that falls idle after a burst (a rayon worker after a bulk
/// build) keeps them resident until then; calling this on it returns them now.
pub fn collect() {
    // SAFETY: `mi_collect` walks the calling thread's own heap and mimalloc's shared state
    // under its own locks; it has no preconditions.
    unsafe { mi::mi_collect(true) }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// Sizes through every small size class and a few large ones, at every alignment up to
    /// a page, eight blocks live at a time (so they sit at different places in their pages):
    /// each block is at its alignment, holds what is written to it, and keeps it through
    /// growing and shrinking, whichever path served it.
    #[test]
    fn blocks_are_aligned_and_keep_their_contents() {
        let a = MiMalloc;
        let mut sizes: Vec<usize> = (1..=1100).collect();
        sizes.extend([2047, 2048, 4095, 4096, 8191, 8192, 65_535, 65_536, 1 << 20]);
        let fill = |p: *mut u8, n: usize, seed: usize| {
            // SAFETY: callers pass a live block of at least `n` bytes.
            (0..n).for_each(|i| unsafe { *p.add(i) = (i ^ seed) as u8 });
        };
        let holds = |p: *mut u8, n: usize, seed: usize| {
            // SAFETY: as for `fill`.
            (0..n).all(|i| unsafe { *p.add(i) } == (i ^ seed) as u8)
        };
        for &size in &sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let grown = size * 2 + 8;
                let small = size.div_ceil(2);
                // SAFETY: non-zero sizes; every block is freed once, with its current layout.
                unsafe {
                    let mut blocks: Vec<*mut u8> = (0..8).map(|_| a.alloc(layout)).collect();
                    for (k, &p) in blocks.iter().enumerate() {
                        assert!(!p.is_null());
                        assert_eq!(p as usize % align, 0, "alloc {size} at {align}");
                        fill(p, size, k);
                    }
                    for (k, p) in blocks.iter_mut().enumerate() {
                        *p = a.realloc(*p, layout, grown);
                        assert_eq!(*p as usize % align, 0, "grow {size} at {align}");
                        assert!(holds(*p, size, k), "grow {size} at {align}");
                    }
                    let grown_layout = Layout::from_size_align(grown, align).unwrap();
                    for (k, p) in blocks.iter_mut().enumerate() {
                        *p = a.realloc(*p, grown_layout, small);
                        assert_eq!(*p as usize % align, 0, "shrink {size} at {align}");
                        assert!(holds(*p, small, k), "shrink {size} at {align}");
                    }
                    let small_layout = Layout::from_size_align(small, align).unwrap();
                    blocks.iter().for_each(|&p| a.dealloc(p, small_layout));

                    let zeroed: Vec<*mut u8> = (0..8).map(|_| a.alloc_zeroed(layout)).collect();
                    for &z in &zeroed {
                        assert_eq!(z as usize % align, 0, "zeroed {size} at {align}");
                        assert!(
                            (0..size).all(|i| *z.add(i) == 0),
                            "zeroed {size} at {align}"
                        );
                        fill(z, size, 1);
                    }
                    zeroed.iter().for_each(|&z| a.dealloc(z, layout));
                }
            }
        }
    }

    /// The layouts Rust types have (size a multiple of an alignment up to 16) take the plain
    /// calls; the rest take the aligned ones.
    #[test]
    fn plain_calls_serve_type_layouts() {
        for (align, size, want) in [
            (1, 1, true),
            (1, 1021, true),
            (8, 24, true),
            (8, 48, true),
            (16, 16, true),
            (16, 48, true),
            (8, 12, false),
            (16, 24, false),
            (32, 32, false),
            (64, 4096, false),
        ] {
            assert_eq!(plain(align, size), want, "size {size} align {align}");
        }
    }
}
