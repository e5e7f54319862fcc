//! `--profile-budget`: a cap on the total time spent measuring profiles in one plan.

use std::time::Duration;

/// How much measuring time is left. A measurement is started only when it is expected to end
/// within the budget: expected to take as long as the longest one so far (profile runs of one
/// plan have the same number of jobs, so the longest is a fair bound for the next).
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileBudget {
    limit: Duration,
    spent: Duration,
    longest: Duration,
}

impl ProfileBudget {
    pub fn new(limit: Duration) -> ProfileBudget {
        ProfileBudget {
            limit,
            spent: Duration::ZERO,
            longest: Duration::ZERO,
        }
    }

    /// Whether another measurement fits what is left (a budget of 0 measures nothing: the
    /// plan comes from the cache alone).
    pub fn allows_another(&self) -> bool {
        self.spent + self.longest < self.limit
    }

    /// Why another measurement may not start, in words, where it may not: the budget is spent,
    /// or what is left is shorter than the longest measurement so far (one fcn_resnet50
    /// profile in 16 SMs took 94 s of a 150 s budget on the H200, its build included: the
    /// next was not started with 56 s left, which "spent" alone did not say).
    pub fn refusal(&self) -> Option<String> {
        if self.allows_another() {
            return None;
        }
        let s = |d: Duration| d.as_secs_f64();
        Some(if self.spent >= self.limit {
            format!(
                "the profiling budget is spent ({:.1} s of {:.1} s)",
                s(self.spent),
                s(self.limit)
            )
        } else {
            format!(
                "the next measurement would not end within the profiling budget: {:.1} s of \
                 {:.1} s are left, and the longest so far took {:.1} s",
                s(self.limit - self.spent),
                s(self.limit),
                s(self.longest)
            )
        })
    }

    /// Counts a measurement that took `took`.
    pub fn charge(&mut self, took: Duration) {
        self.spent += took;
        self.longest = self.longest.max(took);
    }

    pub fn spent(&self) -> Duration {
        self.spent
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_measurement_starts_only_if_it_should_end_within_the_budget() {
        let mut b = ProfileBudget::new(Duration::from_secs(10));
        assert!(b.allows_another(), "the first one always may");
        b.charge(Duration::from_secs(4));
        assert!(b.allows_another(), "4 + 4 < 10");
        b.charge(Duration::from_secs(3));
        assert!(!b.allows_another(), "7 + 4 > 10");
        assert_eq!(b.spent(), Duration::from_secs(7));
        assert!(!ProfileBudget::new(Duration::ZERO).allows_another());
    }

    #[test]
    fn a_refusal_says_whether_the_budget_is_spent_or_the_next_would_not_fit() {
        let mut b = ProfileBudget::new(Duration::from_secs(150));
        assert_eq!(b.refusal(), None);
        b.charge(Duration::from_millis(93_800));
        let why = b.refusal().unwrap();
        assert!(
            why.contains("would not end within the profiling budget")
                && why.contains("56.2 s of 150.0 s are left")
                && why.contains("longest so far took 93.8 s"),
            "{why}"
        );
        b.charge(Duration::from_secs(60));
        let why = b.refusal().unwrap();
        assert!(
            why.contains("the profiling budget is spent (153.8 s of 150.0 s)"),
            "{why}"
        );
    }
}
