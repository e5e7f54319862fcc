//! The memory planner every backend shares: given each activation storage's size and lifetime
//! (the first and last step that touches it), place the storages in one arena so that two
//! storages alive at the same step never share a byte.
//!
//! The CPU backend plans f32 storages on 64-byte lines, the CUDA backend device storages on
//! 256-byte boundaries; both call [`assign_offsets`] with their own [`ArenaRules`].

/// One arena storage: `bytes` long, alive from step `first` to step `last` (inclusive), placed
/// at byte `offset` by [`assign_offsets`].
#[derive(Clone, Debug, PartialEq)]
pub struct Storage {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
    pub offset: usize,
}

impl Storage {
    /// A storage of `bytes` first touched at step `first` (and, until extended, last too).
    pub fn new(bytes: usize, first: usize) -> Storage {
        Storage {
            bytes,
            first,
            last: first,
            offset: 0,
        }
    }

    /// Whether `self` and `other` are alive at a common step.
    pub fn lives_with(&self, other: &Storage) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// How a backend wants its arena laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaRules {
    /// Every offset and every storage's footprint is a multiple of this many bytes.
    pub align: usize,
    /// A storage occupies at least this many bytes when it is placed (and so counts towards the
    /// arena's size) even when it is empty. The CUDA backend uses 1 so that every storage has a
    /// distinct, valid device address; the CPU backend 0.
    pub min_bytes: usize,
}

impl ArenaRules {
    /// `n` rounded up to the alignment.
    pub fn align(&self, n: usize) -> usize {
        n.div_ceil(self.align) * self.align
    }
}

/// Greedy best-fit by size: each storage, largest first (ties in index order), goes to the
/// lowest aligned offset that overlaps no placed storage whose lifetime intersects its own.
/// Sets every `offset` and returns the arena's size in bytes.
pub fn assign_offsets(st: &mut [Storage], rules: ArenaRules) -> usize {
    let mut order: Vec<usize> = (0..st.len()).collect();
    order.sort_by(|&a, &b| st[b].bytes.cmp(&st[a].bytes).then(a.cmp(&b)));
    let mut placed: Vec<usize> = Vec::with_capacity(st.len());
    let mut total = 0;
    for &i in &order {
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| st[j].lives_with(&st[i]))
            .map(|&j| (st[j].offset, st[j].offset + rules.align(st[j].bytes)))
            .collect();
        busy.sort_unstable();
        let need = rules.align(st[i].bytes.max(rules.min_bytes));
        let mut at = 0;
        for (start, end) in busy {
            if at + need <= start {
                break;
            }
            at = at.max(end);
        }
        st[i].offset = at;
        total = total.max(at + need);
        placed.push(i);
    }
    total
}

/// The invariant tests check: no two non-empty storages alive at the same step overlap in memory.
pub fn check_no_overlap(st: &[Storage]) -> std::result::Result<(), String> {
    for (i, a) in st.iter().enumerate() {
        for (j, b) in st.iter().enumerate().skip(i + 1) {
            let mem = a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
            if a.lives_with(b) && mem && a.bytes > 0 && b.bytes > 0 {
                return Err(format!("storages {i} and {j} overlap: {a:?} {b:?}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: ArenaRules = ArenaRules {
        align: 64,
        min_bytes: 0,
    };
    const CUDA: ArenaRules = ArenaRules {
        align: 256,
        min_bytes: 1,
    };

    fn storage(bytes: usize, first: usize, last: usize) -> Storage {
        Storage {
            last,
            ..Storage::new(bytes, first)
        }
    }

    #[test]
    fn storages_that_never_live_together_share_bytes() {
        let mut st = vec![storage(1000, 0, 1), storage(1000, 2, 3), storage(500, 1, 2)];
        let total = assign_offsets(&mut st, CUDA);
        check_no_overlap(&st).unwrap();
        assert_eq!(st[0].offset, st[1].offset);
        assert_eq!(st[2].offset, 1024);
        assert_eq!(total, 1024 + 512);
    }

    #[test]
    fn largest_goes_first_and_gaps_are_reused() {
        // 64 B alive throughout, 128 B early, 128 B late: the late one reuses the early one's
        // bytes, the small one sits after them.
        let mut st = vec![storage(64, 0, 9), storage(128, 0, 3), storage(100, 4, 9)];
        let total = assign_offsets(&mut st, CPU);
        check_no_overlap(&st).unwrap();
        assert_eq!(st.iter().map(|s| s.offset).collect::<Vec<_>>(), [128, 0, 0]);
        assert_eq!(total, 192);
    }

    #[test]
    fn an_empty_storage_takes_room_only_where_the_rules_say() {
        let mut cpu = vec![storage(0, 0, 1), storage(64, 0, 1)];
        assert_eq!(assign_offsets(&mut cpu, CPU), 64);
        let mut cuda = vec![storage(0, 0, 1)];
        assert_eq!(assign_offsets(&mut cuda, CUDA), 256);
    }

    #[test]
    fn overlap_check_finds_a_clash() {
        let st = vec![
            Storage {
                offset: 0,
                ..storage(100, 0, 2)
            },
            Storage {
                offset: 64,
                ..storage(100, 2, 3)
            },
        ];
        assert!(check_no_overlap(&st).is_err());
    }
}
