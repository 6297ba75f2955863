//! The server's allocator: mimalloc, switching heaps when a burst of connections begins.
//!
//! mimalloc gives a page back to the OS only when every block in it is free. Blocks that live
//! across a burst of connections (the engine's state, a connection that stays, runtime
//! bookkeeping) sat in the same pages as the burst's short-lived blocks, and each kept a page
//! that the burst had filled: after a 10,000-connection soak the RSS stayed 2.8 MB above its
//! level before (`scripts/soak`; 250 live blocks held 2.3 MB of pages). So the process
//! allocates from one of two heaps: a burst runs on the spare heap, and once connections fall
//! back the main heap is current again. What lived before the burst stays in pages the burst
//! does not touch; the burst's pages empty when it ends, all but those of the few blocks it
//! leaves behind; and what is made after it (statistics made anew after CONFIG RESETSTAT, the
//! next slow-log entries) goes back among the long-lived blocks instead of keeping a burst's
//! page (a 30 s soak ended 0.83-1.24 MB above its level before while the two heaps took turns
//! and the switch back waited for a trim, 0.48-0.51 MB now). A block that grows
//! (realloc) stays in the heap it came from, so that a structure made before a burst and grown
//! during it (tokio's run queues, the engine's tables) does not end up in the burst's pages.
//!
//! mimalloc is built with each page's info inside the page (`.cargo/config.toml`), so that the
//! infos of the pages a burst used go back to the OS with the pages.
//!
//! The binary installs [`ServerAlloc`] as its global allocator. Under any other allocator
//! (tests) the functions below change nothing that matters.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Once;

use libmimalloc_sys as mi;

// Every thread allocates from a heap another thread made, which mimalloc v3 allows ("heaps can
// allocate from any thread", mimalloc.h) and v2 does not. `mi_theap_t` exists only in v3's
// bindings: this stops the build if a dependency turns on libmimalloc-sys's `v2` feature.
const _: Option<&mi::mi_theap_t> = None;

/// The heap of bursts, made by [`init`] (each heap costs about 200 KB of mimalloc's metadata, so
/// every burst uses this one rather than one of its own).
static SPARE: AtomicPtr<mi::mi_heap_t> = AtomicPtr::new(std::ptr::null_mut());
static MAKE_SPARE: Once = Once::new();

/// The heap every thread allocates from now: null for mimalloc's main heap, or [`SPARE`]
/// during a burst.
static CURRENT: AtomicPtr<mi::mi_heap_t> = AtomicPtr::new(std::ptr::null_mut());

/// Whether connections fell back since the last switch, so that the next burst switches.
static ARMED: AtomicBool = AtomicBool::new(true);

/// Whether [`SPARE`] was ever current (until then, no thread has a part of it to trim).
static SPARE_USED: AtomicBool = AtomicBool::new(false);

/// mimalloc, allocating from the current heap (see the module docs).
pub struct ServerAlloc;

// SAFETY: every path hands the request to mimalloc, which returns blocks of at least the
// requested size and alignment (or null); mi_free and realloc accept a block of any heap.
unsafe impl GlobalAlloc for ServerAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        from_current(layout, mi::mi_malloc_aligned, mi::mi_heap_malloc_aligned)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        from_current(layout, mi::mi_zalloc_aligned, mi::mi_heap_zalloc_aligned)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A block grows in the heap it came from: a structure made before a burst and grown
        // during it (a run queue, a table of the engine's) must not land in the burst's pages.
        let ptr = ptr as *mut c_void;
        mi::mi_heap_realloc_aligned(mi_heap_of(ptr), ptr, new_size, layout.align()) as *mut u8
    }
}

extern "C" {
    /// The heap that `p`, a block mimalloc gave, belongs to (v3's mimalloc.h; libmimalloc-sys
    /// does not bind it).
    fn mi_heap_of(p: *const c_void) -> *mut mi::mi_heap_t;
}

/// Allocates `layout` with `main` (mimalloc's main heap) or `in_heap` (the current heap).
///
/// # Safety
/// As [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
unsafe fn from_current(
    layout: Layout,
    main: unsafe extern "C" fn(usize, usize) -> *mut c_void,
    in_heap: unsafe extern "C" fn(*mut mi::mi_heap_t, usize, usize) -> *mut c_void,
) -> *mut u8 {
    let heap = CURRENT.load(Ordering::Acquire);
    let p = if heap.is_null() {
        main(layout.size(), layout.align())
    } else {
        in_heap(heap, layout.size(), layout.align())
    };
    p as *mut u8
}

/// Makes the second heap. The binary calls it first thing; until then everything comes from
/// the main heap.
pub fn init() {
    MAKE_SPARE.call_once(|| {
        // SAFETY: mi_heap_new takes no arguments; the heap lives as long as the process.
        SPARE.store(unsafe { mi::mi_heap_new() }, Ordering::Release);
    });
}

/// A burst of connections began: unless one already did since connections last fell back
/// ([`rearm`]), the process allocates from the spare heap from now on.
pub fn burst_began() {
    let spare = SPARE.load(Ordering::Acquire);
    if spare.is_null() || !ARMED.swap(false, Ordering::Relaxed) {
        return;
    }
    SPARE_USED.store(true, Ordering::Relaxed);
    CURRENT.store(spare, Ordering::Release);
}

/// Connections fell back well below a burst: the process allocates from the main heap again,
/// and the next burst moves to the spare heap. Called as they fall, not at the trim after
/// them: what is made right after a burst (CONFIG RESETSTAT's statistics) then lands among
/// the long-lived blocks, not in a page of the burst's that it would keep.
pub fn rearm() {
    CURRENT.store(std::ptr::null_mut(), Ordering::Release);
    ARMED.store(true, Ordering::Relaxed);
}

/// Hands the calling thread's free memory in both heaps back to the OS now: empty pages go back
/// to mimalloc's arenas, and every range waiting for its purge delay is purged at once (an idle
/// thread would otherwise never purge, and keep its pages).
pub fn trim() {
    // SAFETY: mi_collect walks only the calling thread's own part of the main heap, and the
    // arenas. mi_heap_collect does the same for the spare heap, making this thread's part of it
    // if there is none yet: hence only once the spare heap has been in use.
    unsafe {
        mi::mi_collect(true);
        if SPARE_USED.load(Ordering::Relaxed) {
            mi::mi_heap_collect(SPARE.load(Ordering::Acquire), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where mimalloc keeps a page's info, found from the address of the page's first block:
    /// the build must put it in the page itself (`.cargo/config.toml` defines
    /// `MI_PAGE_META_IS_SEPARATED=0`), or a burst's page infos stay resident after it.
    #[test]
    fn page_info_lives_in_its_page() {
        unsafe extern "C" fn first_area(
            _heap: *const mi::mi_heap_t,
            area: *const mi::mi_heap_area_t,
            _block: *mut c_void,
            _size: usize,
            arg: *mut c_void,
        ) -> bool {
            *(arg as *mut usize) = (*area).blocks as usize;
            false
        }
        // SAFETY: a heap of the test's own; the visitor only reads the area it is given.
        let start = unsafe {
            let heap = mi::mi_heap_new();
            let block = mi::mi_heap_malloc(heap, 4096);
            let mut blocks = 0usize;
            mi::mi_heap_visit_blocks(heap, false, Some(first_area), &mut blocks as *mut _ as _);
            mi::mi_free(block);
            mi::mi_heap_delete(heap);
            blocks
        };
        assert_ne!(start, 0, "the heap's page was visited");
        // Pages start at 64 KiB slices of the arena; the page info comes before the blocks.
        assert_ne!(
            start % (64 * 1024),
            0,
            "blocks start a slice: mimalloc keeps page infos apart (.cargo/config.toml not used?)"
        );
    }
}
