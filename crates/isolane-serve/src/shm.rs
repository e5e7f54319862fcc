//! The system shared memory extension: regions a client on the same host registers by their
//! POSIX shared memory key, mapped here once, from which inputs are read and into which
//! outputs are written, so that a large frame does not cross the socket.
//!
//! An input read from a region is not copied out of it: its tensor's bytes are a view of the
//! mapping ([`SharedRegions::read`]), which the model's thread copies straight into the model's
//! input slot. The view holds the mapping, so a region unregistered while a request that reads
//! it is queued stays mapped until that request is done with it.
//!
//! On a server of cuda models (in this process) a region that starts on a page is also
//! page-locked (to its last page's end) for the GPU when it is registered ([`SharedRegions::pinned_on`],
//! `cuMemHostRegister`): a
//! request whose input fills a model's whole input is then copied to the device straight from
//! the region, not through the model's input slot ([`PinnedRanges::holds`]). Where locking fails (no GPU,
//! an offset that is not a page's start, the driver's refusal) the region is served as before,
//! through the copy. The lock is undone when the mapping goes: the region unregistered (or the
//! server stopped) and the last request reading it done.
//!
//! A region is another process's memory: it may change while it is read, and it may be
//! truncated under the mapping. Writes go through raw pointers and every access is bounded by
//! the size the region was registered with; a client that writes an input while its request is
//! in flight gets a torn input. An object shrunk by its client after it was registered is
//! refused by the next request that reads or writes past its new end (its size is read before
//! each access: touching a mapped page past an object's end raises SIGBUS, which would end the
//! server); a client that shrinks it between that check and the model's copy of the input, a
//! queue's wait later, can still make the server fault. Shared memory is for clients the
//! server's user trusts (docs/serve.md).

use std::any::Any;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use isolane_protocol::{ProtocolError, SharedMemory, SharedRef};
use memmap2::{MmapOptions, MmapRaw};

/// Regions registered at once, at most.
pub const MAX_REGIONS: usize = 1024;

/// Where POSIX shared memory objects live on Linux (`shm_open` names).
const SHM_DIR: &str = "/dev/shm";

/// A registered region, as the status endpoints describe it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: u64,
    pub byte_size: u64,
}

struct Region {
    status: RegionStatus,
    map: Arc<Mapped>,
}

/// A region's mapping and, where it is page-locked for the GPU, the lock, which goes first
/// (fields drop in order): pages are never unmapped while locked.
struct Mapped {
    pin: Option<isolane_gpu::host_pin::HostPin>,
    map: MmapRaw,
    /// The object mapped, kept open to read its size before each access, and where in it the
    /// mapping starts.
    file: std::fs::File,
    offset: u64,
}

impl Mapped {
    /// Whether the object still holds the mapping's first `end` bytes. A client owns its object
    /// and may shrink it after registering it; touching a mapped page past the object's end
    /// raises SIGBUS, which would end the server with every request in flight.
    fn holds(&self, end: u64) -> Result<(), String> {
        let size = self.file.metadata().map_err(|e| e.to_string())?.len();
        let need = self.offset.saturating_add(end);
        if size < need {
            return Err(format!(
                "its object now holds {size} bytes, short of the {need} this range needs (shrunk \
                 by its client after it was registered; register it again)"
            ));
        }
        Ok(())
    }

    fn as_ptr(&self) -> *const u8 {
        self.map.as_ptr()
    }

    fn as_mut_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

/// The address ranges page-locked for the GPU, each with what keeps it so (a region's
/// [`Mapped`]): the server's, held by its [`SharedRegions`] and by each served model, whose
/// thread launches a copy knowing a request's input only by its bytes, not by the region it
/// came from. An address belongs to one mapping at a time, and a range counts only while what
/// locks it lives.
#[derive(Default)]
pub struct PinnedRanges {
    ranges: Mutex<Vec<Locked>>,
}

/// A locked range's start and end, and what keeps it locked.
type Locked = (usize, usize, Weak<dyn Any + Send + Sync>);

impl PinnedRanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Locked>> {
        self.ranges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `len` bytes at `start` as page-locked for as long as `keep` lives.
    fn add(&self, start: usize, len: usize, keep: Weak<dyn Any + Send + Sync>) {
        let mut ranges = self.lock();
        ranges.retain(|(_, _, k)| k.strong_count() > 0);
        ranges.push((start, start + len, keep));
    }

    /// Whether `data` lies within memory page-locked for the GPU (a registered region's
    /// pages), so that a device copy may read it in place. The caller holds what `data` is a
    /// view of, which keeps the lock.
    pub(crate) fn holds(&self, data: &[u8]) -> bool {
        self.holds_at(data.as_ptr() as usize, data.len())
    }

    fn holds_at(&self, start: usize, len: usize) -> bool {
        let end = start.saturating_add(len);
        len > 0
            && self
                .lock()
                .iter()
                .any(|(s, e, keep)| *s <= start && end <= *e && keep.strong_count() > 0)
    }

    /// Marks `data` as page-locked while `keep` lives, without a GPU: for tests of the direct
    /// copy's hand-off on the CPU.
    #[cfg(test)]
    pub(crate) fn pretend(&self, data: &[u8], keep: &Arc<dyn Any + Send + Sync>) {
        self.add(data.as_ptr() as usize, data.len(), Arc::downgrade(keep));
    }
}

/// `len` bytes at `start` of a region's mapping, as the bytes of an input tensor; holds the
/// mapping (and its lock), so that it stays mapped while the tensor lives.
struct View {
    map: Arc<Mapped>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start + len` is within the mapping (checked by `SharedRegions::range` when
        // the view was made), which `self.map` keeps mapped for as long as the slice can be
        // used. The bytes are another process's, which may write them meanwhile: the server
        // only copies them (into the model's input), so such a write tears that request's
        // input, as the protocol leaves it to the client not to.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.start), self.len) }
    }
}

/// The server's registered regions.
#[derive(Default)]
pub struct SharedRegions {
    regions: Mutex<BTreeMap<String, Region>>,
    /// The locked regions' address ranges, shared with the served models' threads.
    pinned: Arc<PinnedRanges>,
    /// The GPU whose primary context page-locks regions (`None`: none is locked).
    pin_on: Option<u32>,
    /// Whether a region was page-locked, and whether one could not be, said on stderr (once
    /// each: a client registers its regions again for every run).
    said: [std::sync::atomic::AtomicBool; 2],
}

fn refused(reason: String) -> ProtocolError {
    ProtocolError::Tensor {
        tensor: "shared memory".into(),
        field: "region",
        message: reason,
    }
}

/// A region asked for that is not registered: Triton's NOT_FOUND (404).
fn not_found(what: String) -> ProtocolError {
    ProtocolError::NotFound {
        what: format!("shared memory: {what}"),
    }
}

impl SharedRegions {
    /// Regions page-locked for GPU `gpu` when they are registered, where they can be (`None`:
    /// never, as on a server without cuda models in its own process), their ranges recorded in
    /// `pinned`, which the served models read.
    pub fn pinned_on(gpu: Option<u32>, pinned: Arc<PinnedRanges>) -> SharedRegions {
        SharedRegions {
            regions: Mutex::default(),
            pinned,
            pin_on: gpu,
            said: Default::default(),
        }
    }

    /// The ranges of the regions page-locked for the GPU.
    pub fn pinned(&self) -> &Arc<PinnedRanges> {
        &self.pinned
    }

    /// Whether region `name` is page-locked for the GPU.
    pub fn is_region_pinned(&self, name: &str) -> bool {
        self.lock().get(name).is_some_and(|r| r.map.pin.is_some())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Region>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps `byte_size` bytes at `offset` of the object `key` (`/name`, as `shm_open` takes
    /// it) as region `name`.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), ProtocolError> {
        let object = key.strip_prefix('/').unwrap_or(key);
        if name.is_empty() {
            return Err(refused(format!(
                "the region's name is empty (key `{key}`); name it, as requests will"
            )));
        }
        if object.is_empty() || object.contains('/') || object == ".." {
            return Err(refused(format!(
                "region `{name}`: key `{key}` is not a shared memory object's name (`/name`, \
                 as shm_open takes it)"
            )));
        }
        if byte_size == 0 {
            return Err(refused(format!("region `{name}`: byte_size is 0")));
        }
        let mut regions = self.lock();
        if regions.contains_key(name) {
            return Err(ProtocolError::AlreadyExists {
                what: format!(
                    "shared memory region `{name}` is registered already; unregister it first"
                ),
            });
        }
        if regions.len() >= MAX_REGIONS {
            return Err(refused(format!(
                "{MAX_REGIONS} regions are registered, the most a server holds; unregister some"
            )));
        }
        let path = std::path::Path::new(SHM_DIR).join(object);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| refused(format!("region `{name}`: cannot open key `{key}`: {e}")))?;
        let size = file
            .metadata()
            .map_err(|e| refused(format!("region `{name}`: key `{key}`: {e}")))?
            .len();
        if !file.metadata().is_ok_and(|m| m.is_file())
            || offset.checked_add(byte_size).is_none_or(|end| end > size)
        {
            return Err(refused(format!(
                "region `{name}`: {byte_size} bytes at offset {offset} reach past key `{key}`, \
                 which holds {size} bytes"
            )));
        }
        let len = usize::try_from(byte_size)
            .map_err(|_| refused(format!("region `{name}`: byte_size {byte_size} too large")))?;
        let map = MmapOptions::new()
            .offset(offset)
            .len(len)
            .map_raw(&file)
            .map_err(|e| refused(format!("region `{name}`: cannot map key `{key}`: {e}")))?;
        // A region that ends inside a page is locked to that page's end: the mapping holds
        // whole pages, and the page that holds the region's last byte is the object's.
        let pin_len = len.next_multiple_of(isolane_gpu::host_pin::page_size());
        let pin = self.pin_on.and_then(|gpu| {
            // SAFETY: the range is the mapping just made (its pages, to the last one's end),
            // which the `Mapped` below holds, and which drops the lock before the mapping.
            let pinned = unsafe { isolane_gpu::host_pin::pin_host(gpu, map.as_mut_ptr(), pin_len) };
            let line = match &pinned {
                Ok(_) => format!(
                    "shared memory region `{name}` is page-locked for GPU {gpu}: a model's \
                     input in it is copied to the device in place"
                ),
                Err(e) => format!(
                    "shared memory region `{name}` is not page-locked for the GPU ({e}): its \
                     inputs are copied through the model's input slot"
                ),
            };
            if !self.said[usize::from(pinned.is_err())].swap(true, Ordering::Relaxed) {
                eprintln!("isolane serve: {line} (said once)");
            }
            tracing::info!(target: "isolane::serve", "{line}");
            pinned.ok()
        });
        let mapped = Arc::new(Mapped {
            pin,
            map,
            file,
            offset,
        });
        if mapped.pin.is_some() {
            let keep: Arc<dyn Any + Send + Sync> = mapped.clone();
            self.pinned
                .add(mapped.as_ptr() as usize, pin_len, Arc::downgrade(&keep));
        }
        regions.insert(
            name.to_string(),
            Region {
                status: RegionStatus {
                    name: name.to_string(),
                    key: key.to_string(),
                    offset,
                    byte_size,
                },
                map: mapped,
            },
        );
        Ok(())
    }

    /// Unregisters region `name`, or every region (`None`).
    /// Unregisters region `name`, or every region. A name not registered is no error: none
    /// is registered under it afterwards, as asked (Triton answers so too, and clients clear
    /// a region before registering it).
    pub fn unregister(&self, name: Option<&str>) -> Result<(), ProtocolError> {
        let mut regions = self.lock();
        match name {
            None => regions.clear(),
            Some(n) => {
                regions.remove(n);
            }
        }
        Ok(())
    }

    /// Region `name`'s status, or every region's.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>, ProtocolError> {
        let regions = self.lock();
        match name {
            None => Ok(regions.values().map(|r| r.status.clone()).collect()),
            Some(n) => regions
                .get(n)
                .map(|r| vec![r.status.clone()])
                .ok_or_else(|| not_found(format!("no region `{n}` is registered"))),
        }
    }

    /// The mapping and range `r` names within it, checked against the region's size.
    fn range(
        &self,
        r: &SharedRef,
        what: &str,
    ) -> Result<(Arc<Mapped>, usize, usize), ProtocolError> {
        let regions = self.lock();
        let region = regions.get(&r.region).ok_or_else(|| {
            not_found(format!(
                "{what}: no region `{}` is registered (register it first: HTTP POST \
                 /v2/systemsharedmemory/region/NAME/register, gRPC SystemSharedMemoryRegister)",
                r.region
            ))
        })?;
        let size = region.status.byte_size;
        match r.offset.checked_add(r.byte_size) {
            Some(end) if end <= size => {
                region
                    .map
                    .holds(end)
                    .map_err(|why| refused(format!("{what}: region `{}`: {why}", r.region)))?;
                Ok((
                    Arc::clone(&region.map),
                    r.offset as usize,
                    r.byte_size as usize,
                ))
            }
            _ => Err(refused(format!(
                "{what}: {} bytes at offset {} reach past region `{}` ({size} bytes)",
                r.byte_size, r.offset, r.region
            ))),
        }
    }

    /// Writes `data` at the start of the range `r` names (which must hold it).
    pub fn write(&self, r: &SharedRef, data: &[u8], what: &str) -> Result<(), ProtocolError> {
        let (map, start, len) = self.range(r, what)?;
        if data.len() > len {
            return Err(refused(format!(
                "{what} has {} bytes; its shared memory range holds {len}",
                data.len()
            )));
        }
        // SAFETY: `start + data.len() <= byte_size`, the length mapped (checked by `range`);
        // the destination is another process's memory, written through a raw pointer, never
        // through a reference, and `data` (our own) cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), map.as_mut_ptr().add(start), data.len());
        }
        Ok(())
    }
}

impl SharedMemory for SharedRegions {
    /// A view of the bytes, not a copy: on the H200 the copy (a fresh 602 KB buffer each
    /// request) was the `decode` stage's 89 µs of 269 in the server (session 22).
    fn read(&self, r: &SharedRef, what: &str) -> Result<Bytes, ProtocolError> {
        let (map, start, len) = self.range(r, what)?;
        Ok(Bytes::from_owner(View { map, start, len }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isolane_protocol::GrpcCode;

    /// A shared memory object of `bytes`, removed when dropped.
    struct Object(String);

    impl Object {
        fn new(tag: &str, bytes: &[u8]) -> Object {
            let name = format!("isolane-test-{tag}-{}", std::process::id());
            std::fs::write(std::path::Path::new(SHM_DIR).join(&name), bytes).unwrap();
            Object(name)
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(std::path::Path::new(SHM_DIR).join(&self.0));
        }
    }

    fn at(region: &str, offset: u64, byte_size: u64) -> SharedRef {
        SharedRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    #[test]
    fn a_region_is_read_and_written_within_its_bounds() {
        let obj = Object::new("rw", &[1, 2, 3, 4, 5, 6, 7, 8]);
        let shm = SharedRegions::default();
        shm.register("r", &format!("/{}", obj.0), 2, 4).unwrap();
        assert_eq!(shm.read(&at("r", 0, 4), "x").unwrap(), &[3, 4, 5, 6][..]);
        assert_eq!(shm.read(&at("r", 1, 2), "x").unwrap(), &[4, 5][..]);
        assert!(shm
            .read(&at("r", 1, 4), "x")
            .unwrap_err()
            .to_string()
            .contains("reach past"));
        shm.write(&at("r", 2, 2), &[9, 9], "y").unwrap();
        assert_eq!(
            std::fs::read(std::path::Path::new(SHM_DIR).join(&obj.0)).unwrap(),
            vec![1, 2, 3, 4, 9, 9, 7, 8]
        );
        assert!(shm.write(&at("r", 2, 2), &[0; 3], "y").is_err());
        assert_eq!(shm.status(None).unwrap()[0].byte_size, 4);
        shm.unregister(Some("r")).unwrap();
        assert!(shm
            .read(&at("r", 0, 1), "x")
            .unwrap_err()
            .to_string()
            .contains("no region `r`"));
    }

    /// An input read from a region is a view of it, not a copy (the client's later write
    /// shows), and it keeps the region mapped after the region is unregistered and its object
    /// removed: a request queued behind an unregister reads what it was sent with.
    #[test]
    fn an_input_is_a_view_that_outlives_its_regions_unregister() {
        let obj = Object::new("view", &[1, 2, 3, 4, 5, 6, 7, 8]);
        let shm = SharedRegions::default();
        shm.register("r", &format!("/{}", obj.0), 0, 8).unwrap();
        let input = shm.read(&at("r", 2, 4), "x").unwrap();
        assert_eq!(input, &[3, 4, 5, 6][..]);
        shm.write(&at("r", 3, 1), &[42], "y").unwrap();
        assert_eq!(
            input,
            &[3, 42, 5, 6][..],
            "a copy, not a view of the region"
        );
        shm.unregister(Some("r")).unwrap();
        drop(obj);
        assert!(shm.status(None).unwrap().is_empty());
        assert_eq!(input, &[3, 42, 5, 6][..]);
        let again = input.clone();
        drop(input);
        assert_eq!(again, &[3, 42, 5, 6][..]);
    }

    /// A server of cuda models page-locks a region that starts on a page where there is a GPU;
    /// where there is none (or the offset is not a page's start) the region is served all the
    /// same, through the copy. A view of a locked region counts as locked only while the region's
    /// mapping lives: after its unregister, until the last view is gone.
    #[test]
    fn a_region_is_page_locked_where_it_can_be_and_served_where_not() {
        // A page of 64 KiB or of 4 KiB alike starts at 0 and ends at 64 KiB.
        let page = 1 << 16;
        let bytes: Vec<u8> = (0..2 * page).map(|i| (i % 251) as u8).collect();
        let obj = Object::new("pin", &bytes);
        let shm = SharedRegions::pinned_on(Some(0), Arc::default());
        let is_pinned = |data: &[u8]| shm.pinned().holds(data);
        let key = format!("/{}", obj.0);
        shm.register("whole", &key, 0, page as u64).unwrap();
        shm.register("offset", &key, 8, page as u64).unwrap();
        shm.register("short", &key, 0, 100).unwrap();
        shm.register("page2", &key, page as u64, 100).unwrap();
        assert!(
            !shm.is_region_pinned("offset"),
            "not whole pages, yet locked"
        );
        let off = shm.read(&at("offset", 0, 16), "x").unwrap();
        assert_eq!(off, &bytes[8..24]);
        assert!(!is_pinned(&off));
        let view = shm.read(&at("whole", 4, 64), "x").unwrap();
        assert_eq!(view, &bytes[4..68]);
        let gpu = isolane_gpu::driver::device_count().is_ok_and(|n| n > 0);
        assert_eq!(shm.is_region_pinned("whole"), gpu, "locked where a GPU is");
        // Regions that start on a page and end inside one are locked to its end.
        assert_eq!(shm.is_region_pinned("short"), gpu);
        assert_eq!(shm.is_region_pinned("page2"), gpu);
        let short = shm.read(&at("page2", 0, 100), "x").unwrap();
        assert_eq!(short, &bytes[page..page + 100]);
        assert_eq!(is_pinned(&short), gpu);
        drop(short);
        assert_eq!(is_pinned(&view), gpu);
        shm.unregister(None).unwrap();
        assert_eq!(is_pinned(&view), gpu, "a view's region unlocked under it");
        let (addr, len) = (view.as_ptr() as usize, view.len());
        drop(view);
        assert!(
            !shm.pinned().holds_at(addr, len),
            "still counted as locked once unmapped"
        );
        assert!(!SharedRegions::default().is_region_pinned("whole"));
    }

    #[test]
    fn bad_registrations_are_refused_by_name() {
        let obj = Object::new("bad", &[0; 16]);
        let shm = SharedRegions::default();
        let key = format!("/{}", obj.0);
        let e = |r: Result<(), ProtocolError>| r.unwrap_err().to_string();
        assert!(e(shm.register("a", "/../etc/passwd", 0, 4)).contains("not a shared memory"));
        assert!(e(shm.register("a", "/no-such-isolane-object", 0, 4)).contains("cannot open"));
        assert!(e(shm.register("a", &key, 8, 9)).contains("holds 16 bytes"));
        assert!(e(shm.register("a", &key, 0, 0)).contains("byte_size is 0"));
        // Found by trying tritonclient: an empty name was refused as a bad key.
        let empty = e(shm.register("", &key, 0, 16));
        assert!(
            empty.contains("the region's name is empty") && !empty.contains("not a shared memory"),
            "{empty}"
        );
        shm.register("a", &key, 0, 16).unwrap();
        // Issue 32: Triton answers a name registered twice ALREADY_EXISTS (HTTP 400); it was
        // INVALID_ARGUMENT.
        let twice = shm.register("a", &key, 0, 16).unwrap_err();
        assert!(twice.to_string().contains("registered already"), "{twice}");
        assert_eq!(twice.http_status(), 400);
        assert_eq!(twice.grpc_code(), GrpcCode::AlreadyExists);
        assert_eq!(
            (twice.grpc_code().name(), twice.grpc_code().value()),
            ("ALREADY_EXISTS", 6)
        );
        // Found by comparing with Triton: unregistering a name not registered was a 400, and
        // a region's status not registered a 400; they are a success and a 404.
        shm.unregister(Some("b")).unwrap();
        let e = shm.status(Some("b")).unwrap_err();
        assert_eq!(e.http_status(), 404, "{e}");
        assert!(e.to_string().contains("no region `b` is registered"), "{e}");
        shm.unregister(None).unwrap();
        assert!(shm.status(None).unwrap().is_empty());
    }
}
