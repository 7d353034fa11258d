//! Residency reports: what the router is told about this node. The node
//! counts cached rows per embedding shard and tracks which users' prefix
//! KV is resident; a report carries only what changed since the last one.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::router::NodeReport;
use crate::shards::{ShardId, ShardMap};

/// What the router was last told, and what changed since.
#[derive(Clone, Debug, Default)]
pub struct Residency {
    /// Cached rows per shard, of every shard ever touched.
    shard_rows: HashMap<ShardId, u32>,
    shards_reported: HashSet<ShardId>,
    shards_touched: BTreeSet<ShardId>,
    /// Users whose prefix KV the router was last told is here.
    users_reported: HashSet<u64>,
    /// The next report rechecks every user in `users_reported` (the
    /// memory they were resident in was replaced).
    recheck_users: bool,
    /// Reports made so far (each report's `seq`).
    reports: u64,
    /// Full recounts made so far (each walks every row of every shard).
    recounts: u64,
}

impl Residency {
    /// The `seq` of the next report: routers apply reports in this order.
    pub fn next_seq(&mut self) -> u64 {
        self.reports += 1;
        self.reports
    }

    /// Full recounts made so far ([`Self::recount`]).
    pub fn recounts(&self) -> u64 {
        self.recounts
    }

    /// Cached rows of `shard` as counted now (0 for a shard never touched).
    pub fn shard_rows(&self, shard: ShardId) -> u32 {
        self.shard_rows.get(&shard).copied().unwrap_or(0)
    }

    /// A row of (`table`, `row`) entered (`delta` 1) or left (-1) the EMB cache.
    pub fn count_row(&mut self, shards: &ShardMap, table: u16, row: u32, delta: i32) {
        let shard = shards.shard_of(table, row);
        let count = self.shard_rows.entry(shard).or_default();
        *count = count.saturating_add_signed(delta);
        self.shards_touched.insert(shard);
    }

    /// Recounts every shard ever seen with `cached` (after the EMB share
    /// lost rows under the counters: boundary moves that evict, model swaps).
    pub fn recount(&mut self, shards: &ShardMap, cached: impl Fn(u16, u32) -> bool) {
        self.recounts += 1;
        for (&shard, count) in self.shard_rows.iter_mut() {
            let (table, rows) = shards.rows_of(shard);
            *count = rows.filter(|&r| cached(table, r)).count() as u32;
            self.shards_touched.insert(shard);
        }
    }

    /// Adds to `report` the shards whose residency (at least `threshold`
    /// cached rows) changed since the last report.
    pub fn report_shards(&mut self, threshold: f64, report: &mut NodeReport) {
        for shard in std::mem::take(&mut self.shards_touched) {
            let resident = self.shard_rows.get(&shard).copied().unwrap_or(0) as f64 >= threshold;
            let known = self.shards_reported.contains(&shard);
            if resident && !known {
                self.shards_reported.insert(shard);
                report.shards_added.push(shard);
            } else if !resident && known {
                self.shards_reported.remove(&shard);
                report.shards_removed.push(shard);
            }
        }
    }

    /// The next [`Self::report_users`] rechecks every user reported
    /// resident, whatever it is told left (after a model swap: the memory
    /// they were resident in is gone).
    pub fn recheck_users(&mut self) {
        self.recheck_users = true;
    }

    /// Adds to `report` the users whose prefix residency changed: those
    /// served since the last report (`touched`) and those reported
    /// resident that may have lost their prefix since (`left`: evicted or
    /// forgotten). Any other user reported resident still is, so each
    /// report costs O(touched + left), not O(users reported).
    pub fn report_users(
        &mut self,
        touched: BTreeSet<u64>,
        left: BTreeSet<u64>,
        resident: impl Fn(u64) -> bool,
        report: &mut NodeReport,
    ) {
        let mut check = touched;
        if std::mem::take(&mut self.recheck_users) {
            check.extend(self.users_reported.iter().copied());
        } else {
            // Not one that was never reported: one not served since is
            // only added when it is served again.
            check.extend(left.into_iter().filter(|u| self.users_reported.contains(u)));
        }
        for user in check {
            let now = resident(user);
            let known = self.users_reported.contains(&user);
            if now && !known {
                self.users_reported.insert(user);
                report.kv_users_added.push(user);
            } else if !now && known {
                self.users_reported.remove(&user);
                report.kv_users_removed.push(user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_reported_when_they_cross_the_threshold_either_way() {
        let shards = ShardMap::new(&[64], 16);
        let mut r = Residency::default();
        for row in 0..8 {
            r.count_row(&shards, 0, row, 1);
        }
        r.count_row(&shards, 0, 20, 1); // shard 1: one row
        let mut report = NodeReport::default();
        r.report_shards(8.0, &mut report);
        assert_eq!(report.shards_added, vec![shards.shard_of(0, 0)]);
        assert!(report.shards_removed.is_empty());

        // Nothing changed: an empty report.
        let mut report = NodeReport::default();
        r.report_shards(8.0, &mut report);
        assert_eq!(report, NodeReport::default());

        r.count_row(&shards, 0, 3, -1);
        let mut report = NodeReport::default();
        r.report_shards(8.0, &mut report);
        assert_eq!(report.shards_removed, vec![shards.shard_of(0, 0)]);
    }

    #[test]
    fn recount_resets_counts_to_what_is_cached() {
        let shards = ShardMap::new(&[64], 16);
        let mut r = Residency::default();
        r.count_row(&shards, 0, 1, 1);
        // The cache now holds rows 0..16 of table 0 (shard 0), e.g. refilled.
        r.recount(&shards, |t, row| t == 0 && row < 16);
        let mut report = NodeReport::default();
        r.report_shards(16.0, &mut report);
        assert_eq!(report.shards_added, vec![shards.shard_of(0, 0)]);
    }

    fn report_users(
        r: &mut Residency,
        touched: &[u64],
        left: &[u64],
        resident: impl Fn(u64) -> bool,
    ) -> NodeReport {
        let mut report = NodeReport::default();
        let set = |users: &[u64]| users.iter().copied().collect();
        r.report_users(set(touched), set(left), resident, &mut report);
        report
    }

    #[test]
    fn a_user_that_left_without_being_served_is_reported_removed() {
        let mut r = Residency::default();
        let report = report_users(&mut r, &[1, 2], &[], |u| u == 1);
        assert_eq!(report.kv_users_added, vec![1]);
        // User 1 was not served again, but evicted: reported.
        let report = report_users(&mut r, &[], &[1], |_| false);
        assert_eq!(report.kv_users_removed, vec![1]);
        assert!(report.kv_users_added.is_empty());
    }

    #[test]
    fn only_touched_and_left_users_are_checked() {
        let mut r = Residency::default();
        report_users(&mut r, &[1, 2, 3], &[], |_| true);
        let checked = std::cell::RefCell::new(Vec::new());
        let resident = |u| {
            checked.borrow_mut().push(u);
            u != 2
        };
        // User 4 left but was never reported; 5 is new.
        let report = report_users(&mut r, &[5], &[2, 4], resident);
        assert_eq!(report.kv_users_added, vec![5]);
        assert_eq!(report.kv_users_removed, vec![2]);
        assert_eq!(*checked.borrow(), vec![2, 5]);
    }

    #[test]
    fn a_recheck_checks_every_user_reported_once() {
        let mut r = Residency::default();
        report_users(&mut r, &[1, 2, 3], &[], |_| true);
        r.recheck_users();
        let report = report_users(&mut r, &[], &[], |u| u == 2);
        assert_eq!(report.kv_users_removed, vec![1, 3]);
        // Done: the next report checks what it is told again.
        let report = report_users(&mut r, &[], &[], |_| false);
        assert_eq!(report, NodeReport::default());
    }
}
