//! mimalloc instead of the C library's allocator. A request allocates a dozen or
//! more small blocks (header maps and values, bodies, boxed futures) and frees them
//! at its end; mimalloc's per-thread free lists do that in a fraction of the
//! instructions (`docs/performance.md`, "Figures behind the code"). One setting differs from mimalloc's defaults, at
//! build time (`.cargo/config.toml`): arenas are committed as they are used, not all
//! at once (1 000 000 tracked callers: 92 bytes each instead of 101; the C library's
//! allocator: 86). `benches/memory.rs` measures with the same allocator.
//!
//! mimalloc is called through its plain entry points whenever the alignment asked
//! for is one every mimalloc block has, which is nearly always; its aligned entry
//! points check the alignment and, whenever a page's free list needs refilling,
//! take a second, slower path to the same free lists (the saving is in
//! `docs/performance.md`, "Figures behind the code").

/// Runs the calling thread's collection: frees its empty pages and returns them to
/// the system now (each worker calls it once a second,
/// `sluice::app::set_upkeep`). Forced, not only what is due: mimalloc purges a
/// page whose delay has passed only when its segment is touched again, so after a
/// burst of connections went idle what it kept varied from run to run (8 000 idle
/// HTTP/1.1 connections: 2 000 to 6 220 bytes each; forced: 1 971 to 2 046). A
/// forced collection visits the thread's pages once, a few microseconds a second.
/// Unused by `benches/memory.rs`, which includes this file for the allocator alone.
#[allow(dead_code)]
pub(crate) fn collect() {
    // SAFETY: `mi_collect` takes no pointer and may be called on any thread at any
    // time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// The global allocator of the binary (and of the memory benchmark).
pub(crate) struct Mimalloc;

/// The alignment of every block mimalloc hands out: its size classes are whole
/// 8-byte words, carved from word-aligned pages.
const BLOCK_ALIGN: usize = 8;

// SAFETY: each method passes its arguments to the mimalloc function of the same
// contract (size, alignment, pointer from this allocator), choosing the plain one
// only for alignments of at most BLOCK_ALIGN, which every mimalloc block meets.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: see the impl.
        unsafe {
            match layout.align() <= BLOCK_ALIGN {
                true => mi_malloc(layout.size()),
                false => mi_malloc_aligned(layout.size(), layout.align()),
            }
            .cast()
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: see the impl.
        unsafe {
            match layout.align() <= BLOCK_ALIGN {
                true => mi_zalloc(layout.size()),
                false => mi_zalloc_aligned(layout.size(), layout.align()),
            }
            .cast()
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: see the impl.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        // SAFETY: see the impl.
        unsafe {
            match layout.align() <= BLOCK_ALIGN {
                true => mi_realloc(ptr.cast(), size),
                false => mi_realloc_aligned(ptr.cast(), size, layout.align()),
            }
            .cast()
        }
    }
}
