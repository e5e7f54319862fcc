//! Host memory that CUDA did not allocate (a client's shared memory region, which `isolane
//! serve` maps) page-locked for the GPU with `cuMemHostRegister`, so that a model's input copy
//! reads it straight from where the client wrote it, without first copying it into a pinned
//! buffer of the model's own (docs/serve.md, "Shared memory").

use std::ffi::c_void;

use crate::driver::{self, check, sys, PrimaryContext};
use crate::error::{GpuError, Result};

/// A page-locked range; unlocked when dropped. Registered as portable, so that every context
/// (a green context's as well as the primary one it is registered in) copies from it as from
/// memory of its own.
pub struct HostPin {
    ptr: *mut c_void,
    len: usize,
    /// Unregistering needs a context current; the one registered in is kept alive for it.
    primary: PrimaryContext,
}

// SAFETY: the value holds a driver handle and the address of memory the caller keeps mapped;
// the driver API may be called from any thread, and `Drop` binds the context it needs itself.
unsafe impl Send for HostPin {}
// SAFETY: shared access only reads the address and length.
unsafe impl Sync for HostPin {}

impl HostPin {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The system's page size (the unit `cuMemHostRegister` locks).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// Runs `f` with `primary` current on this thread, then gives the thread its context back.
fn with_context<T>(primary: &PrimaryContext, f: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: the context is retained by `primary` for the whole call.
    check("cuCtxPushCurrent", unsafe {
        sys::cuCtxPushCurrent_v2(primary.raw())
    })?;
    let out = f();
    let mut popped: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: balances the push above on the same thread; valid out-pointer.
    let popped_ok = check("cuCtxPopCurrent", unsafe {
        sys::cuCtxPopCurrent_v2(&mut popped)
    });
    let out = out?;
    popped_ok?;
    Ok(out)
}

/// Page-locks the `len` bytes at `ptr` for the GPUs, in GPU `index`'s primary context. Refused,
/// before any driver call, where the range is empty or not whole pages (a region registered at
/// an offset that is not a page's start: the caller copies instead); an error also where there
/// is no driver or device, or the driver refuses (the caller copies then too).
///
/// # Safety
/// `ptr..ptr + len` must be mapped memory of this process, and stay mapped until the returned
/// value is dropped.
pub unsafe fn pin_host(index: u32, ptr: *mut u8, len: usize) -> Result<HostPin> {
    let page = page_size();
    if len == 0 || !(ptr as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
        return Err(GpuError::Usage(format!(
            "{len} bytes at {ptr:p} are not whole pages of {page} bytes; only whole pages are \
             page-locked"
        )));
    }
    driver::init()?;
    let primary = PrimaryContext::retain(driver::device(index)?)?;
    with_context(&primary, || {
        // SAFETY: the caller keeps the range mapped for as long as the `HostPin` lives, which
        // unregisters it in `Drop`; a context is current (pushed by `with_context`).
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(
                ptr.cast(),
                len,
                sys::CU_MEMHOSTREGISTER_PORTABLE as std::ffi::c_uint,
            )
        })
    })?;
    Ok(HostPin {
        ptr: ptr.cast(),
        len,
        primary,
    })
}

impl Drop for HostPin {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // Errors cannot be reported from Drop; a failed unregister leaves the pages locked
        // until the process ends, never unmapped under a copy.
        let _ = with_context(&self.primary, || {
            // SAFETY: `ptr` was registered by `pin_host` and is unregistered once, here, while
            // still mapped (the caller's promise); a context is current.
            check("cuMemHostUnregister", unsafe {
                sys::cuMemHostUnregister(ptr)
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range that is not whole pages is refused before the driver is asked (so also on a
    /// machine without one), and so is an empty one.
    #[test]
    fn only_whole_pages_are_pinned() {
        let page = page_size();
        let mut buf = vec![0u8; 3 * page];
        let base = buf.as_mut_ptr();
        let aligned = base.wrapping_add(page - (base as usize) % page);
        for (ptr, len) in [
            (aligned, 0),
            (aligned.wrapping_add(1), page),
            (aligned, page + 8),
        ] {
            // SAFETY: every range tried lies within `buf`, which outlives the call; none is
            // registered (each is refused before the driver is called).
            let e = unsafe { pin_host(0, ptr, len) }.err().expect("refused");
            assert!(e.to_string().contains("not whole pages"), "{e}");
        }
    }

    /// Whole pages are pinned and unpinned on a GPU machine; without a driver or device the
    /// error says so and nothing panics.
    #[test]
    fn whole_pages_pin_where_there_is_a_gpu_and_fail_cleanly_where_not() {
        let page = page_size();
        let layout = std::alloc::Layout::from_size_align(4 * page, page).expect("layout");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        let gpu = driver::device_count().is_ok_and(|n| n > 0);
        // SAFETY: the allocation outlives the pin, which is dropped at the end of the match.
        match unsafe { pin_host(0, ptr, 4 * page) } {
            Ok(pin) => {
                assert!(gpu, "pinned without a GPU");
                assert_eq!(pin.len(), 4 * page);
                drop(pin);
                // Unpinned: the same pages pin again.
                // SAFETY: as above.
                let again = unsafe { pin_host(0, ptr, 4 * page) };
                assert!(again.is_ok(), "{:?}", again.err().map(|e| e.to_string()));
            }
            Err(e) => {
                let text = e.to_string();
                assert!(!gpu, "a GPU is there, yet: {text}");
                assert!(
                    text.contains("not found") || text.contains("no CUDA device"),
                    "{text}"
                );
            }
        }
        // SAFETY: allocated above with this layout, freed once, after the pin is gone.
        unsafe { std::alloc::dealloc(ptr, layout) };
    }
}
