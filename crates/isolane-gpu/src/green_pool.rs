//! Green partitions that can be resized while serving (`isolane ctl resize NAME sms=N`).
//!
//! A green context's SMs are fixed when it is created, so a resize is a new green context of
//! the new size, which the model's next instance is built in before it takes the queue over.
//! Its SMs must not be another model's: one split of the device at the driver's finest unit
//! (`minSmPartitionSize` SMs, coscheduled) is made once, every group is a combination of that
//! split's units (`cuDevResourceGenerateDesc` accepts several results of one split), and a
//! ledger says which units each live group holds. A resize keeps the model's own units (the
//! first ones when it shrinks) and adds free ones; during the hand-over the old and the new
//! context of the same model share the kept units, never another model's. A unit is free again
//! when the last group holding it is dropped (the old instance's executor, after the
//! takeover; the new one, if its build failed).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::driver::{check, sys, PrimaryContext};
use crate::error::{GpuError, Result};
use crate::green::{make_group, zeroed_resource, DeviceSms, DriverSmInfo, GreenGroup};

/// Which units of the split each live group holds. Pure bookkeeping: tested without a GPU.
#[derive(Debug, Default)]
pub struct UnitLedger {
    units: usize,
    next_lease: u64,
    /// Live leases: id → (workload, its units).
    leases: BTreeMap<u64, (String, Vec<usize>)>,
}

impl UnitLedger {
    pub fn new(units: usize) -> UnitLedger {
        UnitLedger {
            units,
            ..Default::default()
        }
    }

    fn held(&self, unit: usize) -> bool {
        self.leases.values().any(|(_, u)| u.contains(&unit))
    }

    /// The units `workload`'s live groups hold, in order.
    pub fn own(&self, workload: &str) -> Vec<usize> {
        let mut own: Vec<usize> = self
            .leases
            .values()
            .filter(|(w, _)| w == workload)
            .flat_map(|(_, u)| u.iter().copied())
            .collect();
        own.sort_unstable();
        own.dedup();
        own
    }

    /// Units no live group holds.
    pub fn free(&self) -> Vec<usize> {
        (0..self.units).filter(|&u| !self.held(u)).collect()
    }

    /// The units a group of `want` units for `workload` takes: its own first (the first ones
    /// when it shrinks), then free ones. Refused, naming what is free, when too few are.
    pub fn choose(&self, workload: &str, want: usize) -> std::result::Result<Vec<usize>, String> {
        if want == 0 {
            return Err("a green partition needs at least one unit".into());
        }
        let own = self.own(workload);
        if want <= own.len() {
            return Ok(own[..want].to_vec());
        }
        let free = self.free();
        let more = want - own.len();
        if free.len() < more {
            return Err(format!(
                "it holds {} unit(s) and {} more are free, {} needed",
                own.len(),
                free.len(),
                want
            ));
        }
        let mut chosen = own;
        chosen.extend(free.into_iter().take(more));
        chosen.sort_unstable();
        Ok(chosen)
    }

    /// Records a live group of `workload` on `units`; returns its lease id.
    pub fn take(&mut self, workload: &str, units: Vec<usize>) -> u64 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.leases.insert(id, (workload.to_string(), units));
        id
    }

    /// The group of lease `id` is gone.
    pub fn give_back(&mut self, id: u64) {
        self.leases.remove(&id);
    }
}

/// A group's hold on its units, given back when the group is dropped.
pub(crate) struct Lease {
    ledger: Arc<Mutex<UnitLedger>>,
    id: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        lock(&self.ledger).give_back(self.id);
    }
}

/// The split's results. A `CUdevResource` is a plain description the driver reads; it holds no
/// handle that belongs to one thread.
struct Units(Vec<sys::CUdevResource>);

// SAFETY: see `Units`: plain data, never written after the split, only read (copied) to
// generate descriptors.
unsafe impl Send for Units {}
// SAFETY: as for Send: shared access only copies the plain structs.
unsafe impl Sync for Units {}

/// One split of a GPU at its finest unit, shared out among green groups and re-shared while
/// serving.
pub struct GreenPool {
    dev: sys::CUdevice,
    primary: Arc<PrimaryContext>,
    units: Units,
    unit_sms: u32,
    ledger: Arc<Mutex<UnitLedger>>,
    /// Whose streams are made at the greatest priority, by workload (kept for their resizes).
    urgent: BTreeMap<String, bool>,
    sm_info: DriverSmInfo,
}

impl GreenPool {
    /// Splits GPU `device_index` into units of its driver's minimum partition and makes one
    /// group per `(workload, SMs, urgent)`, each from consecutive units. Every size must be a
    /// multiple of the unit (the refusal names it).
    pub fn create(
        device_index: u32,
        groups: &[(String, u32, bool)],
    ) -> Result<(Arc<GreenPool>, Vec<GreenGroup>)> {
        let DeviceSms {
            dev,
            primary,
            full,
            sm,
            info: sm_info,
        } = DeviceSms::of(device_index)?;
        let unit = sm.minSmPartitionSize.max(1);
        if let Some((name, sms, _)) = groups
            .iter()
            .find(|(_, s, _)| !s.is_multiple_of(unit) || *s == 0)
        {
            return Err(GpuError::GreenRequest(format!(
                "workload `{name}`: {sms} SMs is not a multiple of the driver's unit of {unit} \
                 SMs, which a green partition resized while serving is made of"
            )));
        }
        let wanted = (sm.smCount / unit) as usize;
        let mut results: Vec<sys::CUdevResource> = (0..wanted).map(|_| zeroed_resource()).collect();
        let mut remainder = zeroed_resource();
        let mut nb = wanted as std::ffi::c_uint;
        // SAFETY: `results` has room for `nb` resources (in: capacity, out: count); `full` is
        // the device's SM resource; remainder is a valid out-pointer.
        check("cuDevSmResourceSplitByCount", unsafe {
            sys::cuDevSmResourceSplitByCount(
                results.as_mut_ptr(),
                &mut nb,
                &full,
                &mut remainder,
                0,
                unit,
            )
        })?;
        results.truncate(nb as usize);
        let needed: u32 = groups.iter().map(|(_, s, _)| s / unit).sum();
        if needed as usize > results.len() {
            return Err(GpuError::GreenRequest(format!(
                "the driver splits the device into {} units of {unit} SMs that keep SMs \
                 scheduled together; these partitions need {needed}",
                results.len()
            )));
        }
        let pool = Arc::new(GreenPool {
            dev,
            primary,
            units: Units(results),
            unit_sms: unit,
            ledger: Arc::new(Mutex::new(UnitLedger::new(nb as usize))),
            urgent: groups.iter().map(|(n, _, u)| (n.clone(), *u)).collect(),
            sm_info,
        });
        let mut made = Vec::with_capacity(groups.len());
        for (index, (name, sms, _)) in groups.iter().enumerate() {
            made.push(pool.group(index, name, *sms)?);
        }
        Ok((pool, made))
    }

    /// SMs per unit: a resize asks for a multiple of it.
    pub fn unit_sms(&self) -> u32 {
        self.unit_sms
    }

    pub fn sm_info(&self) -> DriverSmInfo {
        self.sm_info
    }

    /// SMs no live group holds.
    pub fn free_sms(&self) -> u32 {
        lock(&self.ledger).free().len() as u32 * self.unit_sms
    }

    /// A new green group of `sms` SMs for `workload` (index `index` in its scenario): its own
    /// units first, then free ones. Refused before any driver call when `sms` is not a multiple
    /// of the unit or too few units are free.
    pub fn group(&self, index: usize, workload: &str, sms: u32) -> Result<GreenGroup> {
        if sms == 0 || !sms.is_multiple_of(self.unit_sms) {
            return Err(GpuError::GreenRequest(format!(
                "{sms} SMs: a green partition here is a multiple of {} SMs (the driver's unit)",
                self.unit_sms
            )));
        }
        let want = (sms / self.unit_sms) as usize;
        let (chosen, id) = {
            let mut ledger = lock(&self.ledger);
            let chosen = ledger.choose(workload, want).map_err(|why| {
                GpuError::GreenRequest(format!(
                    "workload `{workload}`: {sms} SMs: {why} (units of {} SMs)",
                    self.unit_sms
                ))
            })?;
            let id = ledger.take(workload, chosen.clone());
            (chosen, id)
        };
        // From here the lease gives the units back if anything below fails.
        let lease = Lease {
            ledger: Arc::clone(&self.ledger),
            id,
        };
        let mut resources: Vec<sys::CUdevResource> =
            chosen.iter().map(|&u| self.units.0[u]).collect();
        let urgent = self.urgent.get(workload).copied().unwrap_or(false);
        let mut g = make_group(self.dev, index, sms, urgent, &mut resources, &self.primary)?;
        g.set_lease(lease);
        Ok(g)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_grows_into_free_units_and_keeps_its_own() {
        let mut l = UnitLedger::new(6);
        let a = l.take("a", vec![0, 1]);
        let _b = l.take("b", vec![2, 3]);
        assert_eq!(l.free(), vec![4, 5]);
        let grown = l.choose("a", 3).unwrap();
        assert_eq!(grown, vec![0, 1, 4]);
        let a2 = l.take("a", grown);
        // During the hand-over both of a's groups live; a's own units are their union.
        assert_eq!(l.own("a"), vec![0, 1, 4]);
        assert_eq!(l.free(), vec![5]);
        l.give_back(a);
        assert_eq!(l.own("a"), vec![0, 1, 4]);
        l.give_back(a2);
        assert_eq!(l.free(), vec![0, 1, 4, 5]);
    }

    #[test]
    fn a_model_shrinks_to_its_first_units_and_frees_the_rest_when_the_old_group_goes() {
        let mut l = UnitLedger::new(4);
        let old = l.take("a", vec![0, 1, 2]);
        let small = l.choose("a", 1).unwrap();
        assert_eq!(small, vec![0]);
        let _new = l.take("a", small);
        assert_eq!(l.free(), vec![3], "the old group still runs on its units");
        l.give_back(old);
        assert_eq!(l.free(), vec![1, 2, 3]);
    }

    #[test]
    fn another_models_units_are_never_taken() {
        let mut l = UnitLedger::new(4);
        l.take("a", vec![0]);
        l.take("b", vec![1, 2, 3]);
        let err = l.choose("a", 2).unwrap_err();
        assert!(
            err.contains("holds 1 unit(s) and 0 more are free, 2 needed"),
            "{err}"
        );
        assert!(l.choose("a", 0).is_err());
    }

    #[test]
    fn a_failed_build_gives_its_units_back() {
        let mut l = UnitLedger::new(3);
        l.take("a", vec![0]);
        let tried = l.take("a", l.choose("a", 3).unwrap());
        assert!(l.free().is_empty());
        l.give_back(tried);
        assert_eq!(l.free(), vec![1, 2]);
        assert_eq!(l.own("a"), vec![0]);
    }
}
