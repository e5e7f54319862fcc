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
}
