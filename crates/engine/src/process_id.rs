//! A lease's owner process id in one pointer.
//!
//! Every lease stores one, so its size counts a million times: a `Box<[u8]>` is a pointer and a
//! length (16 bytes) in the lease's slot. [`ProcessId`] keeps the length in front of the bytes,
//! in the same allocation, as a LEB128 varint (one byte below 128, the default limit): 8 bytes
//! in the slot, and usually no more heap than the boxed slice took (allocators round small
//! blocks up to 8 or 16 bytes anyway).

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ops::Deref;
use std::ptr::{self, NonNull};

/// Process id bytes behind a thin pointer: `[varint length][bytes]`.
pub struct ProcessId(NonNull<u8>);

// SAFETY: a ProcessId owns its allocation alone and never changes it after `new`, like a
// `Box<[u8]>`: moving it to another thread or sharing `&ProcessId` is as safe as for the box.
unsafe impl Send for ProcessId {}
// SAFETY: see `Send`; `&ProcessId` only reads.
unsafe impl Sync for ProcessId {}

/// Largest varint for a `usize` length on 64-bit: 10 bytes.
const MAX_HEAD: usize = 10;

impl ProcessId {
    /// Copies `bytes` into a new allocation.
    pub fn new(bytes: &[u8]) -> ProcessId {
        let mut head = [0u8; MAX_HEAD];
        let mut n = 0;
        let mut len = bytes.len();
        loop {
            let low = (len & 0x7f) as u8;
            len >>= 7;
            head[n] = low | if len > 0 { 0x80 } else { 0 };
            n += 1;
            if len == 0 {
                break;
            }
        }
        let layout = Self::layout(n, bytes.len());
        // SAFETY: the layout's size is at least 1 (the head's first byte).
        let p = unsafe { alloc(layout) };
        let Some(p) = NonNull::new(p) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `p` is valid for `n + bytes.len()` bytes and overlaps neither source.
        unsafe {
            ptr::copy_nonoverlapping(head.as_ptr(), p.as_ptr(), n);
            ptr::copy_nonoverlapping(bytes.as_ptr(), p.as_ptr().add(n), bytes.len());
        }
        ProcessId(p)
    }

    fn layout(head: usize, len: usize) -> Layout {
        Layout::from_size_align(head + len, 1).expect("a process id's size fits a Layout")
    }

    /// (head bytes, length) read from the allocation's start.
    fn parts(&self) -> (usize, usize) {
        let (mut len, mut n) = (0usize, 0);
        loop {
            // SAFETY: `new` wrote a complete varint at the start; this reads no byte past its
            // last (the one without the high bit).
            let b = unsafe { *self.0.as_ptr().add(n) };
            len |= ((b & 0x7f) as usize) << (7 * n);
            n += 1;
            if b & 0x80 == 0 {
                return (n, len);
            }
        }
    }
}

impl Deref for ProcessId {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let (head, len) = self.parts();
        // SAFETY: `new` wrote `len` bytes right after the `head`-byte varint, and they live as
        // long as `self`.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().add(head), len) }
    }
}

impl Drop for ProcessId {
    fn drop(&mut self) {
        let (head, len) = self.parts();
        // SAFETY: allocated in `new` with exactly this layout, and freed only here.
        unsafe { dealloc(self.0.as_ptr(), Self::layout(head, len)) }
    }
}

impl PartialEq for ProcessId {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for ProcessId {}

impl fmt::Debug for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProcessId({:?})", bytes::Bytes::copy_from_slice(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_any_bytes_in_one_pointer() {
        assert_eq!(std::mem::size_of::<ProcessId>(), 8);
        assert_eq!(std::mem::size_of::<Option<ProcessId>>(), 8);
        for len in [0, 1, 7, 127, 128, 129, 300, 16_383, 16_384, 70_000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 256) as u8).collect();
            let p = ProcessId::new(&bytes);
            assert_eq!(&p[..], &bytes[..], "length {len}");
            let head = match len {
                0..=127 => 1,
                128..=16_383 => 2,
                _ => 3,
            };
            assert_eq!(p.parts(), (head, len));
        }
        let p = ProcessId::new(b"worker\r\n\0-7");
        assert_eq!(p, ProcessId::new(b"worker\r\n\0-7"));
        assert_ne!(p, ProcessId::new(b"worker\r\n\0-8"));
        assert_eq!(format!("{p:?}"), "ProcessId(b\"worker\\r\\n\\0-7\")");
        // Dropped on another thread, as a lease of a moved namespace would be.
        std::thread::spawn(move || assert_eq!(&p[..], b"worker\r\n\0-7"))
            .join()
            .unwrap();
    }
}
