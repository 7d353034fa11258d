//! Hot users: the top share of users by requests over the last W windows
//! (HLEM: top 5% over the last 12 five-second windows).
//!
//! The hot set is recomputed at each window boundary from the counts of the
//! previous W windows and then fixed for the window, so a decision depends
//! only on requests already seen.
//!
//! Counters are kept for at most `max_users` users per replica: when full,
//! the least recently seen user's counters are dropped (and counted), so a
//! job that sees millions of users keeps a fixed-size table.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;

use crate::lru::LruMap;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HotnessConfig {
    pub window_ms: u64,
    pub windows: usize,
    /// Share of users (by recent request count) that count as hot.
    pub hot_share: f64,
    /// Users with request counters at most; the least recently seen is
    /// dropped first.
    pub max_users: usize,
}

impl Default for HotnessConfig {
    fn default() -> Self {
        Self {
            window_ms: 5_000,
            windows: 12,
            hot_share: 0.05,
            max_users: 100_000,
        }
    }
}

#[derive(Debug)]
pub struct HotUsers {
    cfg: HotnessConfig,
    /// Per user: request count per window, indexed by window id modulo W,
    /// tagged with the window id so stale slots read as zero.
    counts: LruMap<Vec<(u64, u32)>>,
    current_window: Option<u64>,
    hot: HashSet<u64>,
}

impl HotUsers {
    pub fn new(cfg: HotnessConfig) -> Self {
        Self {
            counts: LruMap::new(cfg.max_users),
            cfg,
            current_window: None,
            hot: HashSet::new(),
        }
    }

    /// Records one request and says whether its user is hot.
    pub fn observe(&mut self, ts_ms: u64, user: u64) -> bool {
        let window = ts_ms / self.cfg.window_ms.max(1);
        // Only forward: in `arrival` mode a request of an earlier window can
        // come after later ones (another source), and rolling back to it
        // would drop every user counted only since.
        if self.current_window.is_none_or(|c| window > c) {
            self.roll_to(window);
        }
        let w = self.cfg.windows.max(1);
        let slots = self
            .counts
            .get_or_insert_with(user, || vec![(u64::MAX, 0); w]);
        let slot = &mut slots[(window % w as u64) as usize];
        if slot.0 == window {
            slot.1 += 1;
        } else if slot.0 == u64::MAX || slot.0 < window {
            *slot = (window, 1);
        }
        // Else the slot holds a later window: this late one is past the
        // W windows counted and is not counted.
        self.hot.contains(&user)
    }

    /// Whether `user` is hot in the current window.
    pub fn is_hot(&self, user: u64) -> bool {
        self.hot.contains(&user)
    }

    /// Number of hot users in the current window.
    pub fn hot_users(&self) -> usize {
        self.hot.len()
    }

    /// Users with counters now.
    pub fn tracked_users(&self) -> usize {
        self.counts.len()
    }

    /// The most users ever tracked at once (never above `max_users`).
    pub fn tracked_users_peak(&self) -> usize {
        self.counts.peak_len()
    }

    /// Users whose counters were dropped because the table was full.
    pub fn evictions(&self) -> u64 {
        self.counts.evictions()
    }

    fn roll_to(&mut self, window: u64) {
        self.current_window = Some(window);
        let w = self.cfg.windows.max(1) as u64;
        // Counts over the W windows before `window`.
        let mut totals: Vec<(u32, u64)> = Vec::with_capacity(self.counts.len());
        self.counts.retain(|user, slots| {
            let total: u32 = slots
                .iter()
                .filter(|(id, _)| *id < window && window - *id <= w)
                .map(|(_, c)| c)
                .sum();
            if total > 0 {
                totals.push((total, user));
            }
            total > 0
        });
        self.hot.clear();
        if totals.is_empty() {
            return;
        }
        // Most requests first; ties to the lower user id, so the set is deterministic.
        totals.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let hot =
            ((totals.len() as f64 * self.cfg.hot_share).ceil() as usize).clamp(1, totals.len());
        self.hot.extend(totals[..hot].iter().map(|&(_, user)| user));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_is_hot_before_the_first_window_closes() {
        let mut h = HotUsers::new(HotnessConfig::default());
        assert!(!h.observe(0, 1));
        assert!(!h.observe(10, 1));
    }

    #[test]
    fn top_share_becomes_hot_after_a_window() {
        let cfg = HotnessConfig {
            window_ms: 1000,
            windows: 2,
            hot_share: 0.1,
            ..Default::default()
        };
        let mut h = HotUsers::new(cfg);
        // 20 users; user 0 makes 10 requests, others 1.
        for _ in 0..10 {
            h.observe(0, 0);
        }
        for u in 1..20 {
            h.observe(1, u);
        }
        // Window 1: the top 10% of 20 users = users 0 and 1 (ties to lower id).
        assert!(h.observe(1000, 0));
        assert!(h.is_hot(1));
        assert!(!h.observe(1001, 5));
        assert_eq!(h.hot_users(), 2);
        // Window 4: windows 2-3 were empty, so nobody is hot any more.
        assert!(!h.observe(4500, 0));
        assert_eq!(h.hot_users(), 0);
    }

    #[test]
    fn a_late_request_is_counted_without_rolling_the_hot_set_back() {
        let cfg = HotnessConfig {
            window_ms: 1000,
            windows: 2,
            hot_share: 0.5,
            ..Default::default()
        };
        let hot_after = |order: &[(u64, u64)]| {
            let mut h = HotUsers::new(cfg.clone());
            for &(ts, user) in order {
                h.observe(ts, user);
            }
            h.observe(2000, 999);
            let mut hot: Vec<u64> = [1, 2].into_iter().filter(|&u| h.is_hot(u)).collect();
            hot.sort();
            hot
        };
        // Window 0: user 1 once; window 1: user 2 three times, user 1 once.
        let in_order = [(0, 1), (1000, 2), (1000, 2), (1000, 2), (1000, 1)];
        // The same requests with user 1's window-0 request arriving late.
        let late = [(1000, 2), (1000, 2), (0, 1), (1000, 2), (1000, 1)];
        assert_eq!(hot_after(&in_order), vec![2]);
        // It gave [1]: rolling back to window 0 dropped user 2's counts.
        assert_eq!(hot_after(&late), vec![2]);
    }

    #[test]
    fn counters_are_bounded_and_the_least_recent_user_is_dropped() {
        let cfg = HotnessConfig {
            window_ms: 1000,
            windows: 2,
            hot_share: 0.1,
            max_users: 10,
        };
        let mut h = HotUsers::new(cfg);
        // User 0 is busy and seen last; 100 one-off users pass by.
        for u in 1..=100 {
            h.observe(u, u);
            h.observe(u, 0);
            assert!(h.tracked_users() <= 10);
        }
        assert_eq!(h.tracked_users_peak(), 10);
        assert_eq!(h.evictions(), 100 - 9);
        // The busy user kept its counts and is hot in the next window.
        assert!(h.observe(1000, 0));
    }
}
