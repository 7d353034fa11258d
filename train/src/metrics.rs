//! Ranking metrics of one positive among sampled or full candidates.

/// HR@10, NDCG@10 and MRR@10 averaged over questions.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankMetrics {
    pub hr_at_10: f64,
    pub ndcg_at_10: f64,
    pub mrr_at_10: f64,
}

/// Where the positive (index 0) stands among the scored candidates: how
/// many score above it and how many tie with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Standing {
    pub above: usize,
    pub tied: usize,
}

impl Standing {
    /// The positive's standing among `scores` (positive at index 0). A
    /// score that is not a number never flatters the positive: a NaN
    /// positive is ranked last, a NaN negative counts as above it.
    pub fn of_first(scores: &[f32]) -> Self {
        let s0 = scores[0];
        if s0.is_nan() {
            return Standing {
                above: scores.len() - 1,
                tied: 0,
            };
        }
        let above = scores[1..]
            .iter()
            .filter(|s| s.is_nan() || **s > s0)
            .count();
        let tied = scores[1..].iter().filter(|&&s| s == s0).count();
        Standing { above, tied }
    }

    /// The standing over two disjoint candidate sets with one positive.
    pub fn plus(self, other: Standing) -> Standing {
        Standing {
            above: self.above + other.above,
            tied: self.tied + other.tied,
        }
    }
}

/// Accumulates standings.
#[derive(Clone, Debug, Default)]
pub struct MetricSum {
    n: u64,
    hr: f64,
    ndcg: f64,
    mrr: f64,
}

impl MetricSum {
    /// Adds one question at 0-based rank `rank`.
    pub fn add(&mut self, rank: usize) {
        self.add_standing(Standing {
            above: rank,
            tied: 0,
        });
    }

    /// Adds one question whose ties are broken at random: each metric is
    /// its expectation over the positive's `tied + 1` equally likely ranks,
    /// so constant scores are neither flattered nor punished.
    pub fn add_standing(&mut self, st: Standing) {
        self.n += 1;
        let share = 1.0 / (st.tied + 1) as f64;
        for rank in (st.above..=st.above + st.tied).take_while(|&r| r < 10) {
            self.hr += share;
            self.ndcg += share / ((rank + 2) as f64).log2();
            self.mrr += share / (rank + 1) as f64;
        }
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    /// The means; all zero before any question (callers refuse an empty
    /// question set before they report).
    pub fn mean(&self) -> RankMetrics {
        let n = self.n.max(1) as f64;
        RankMetrics {
            hr_at_10: self.hr / n,
            ndcg_at_10: self.ndcg / n,
            mrr_at_10: self.mrr / n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_metrics() {
        assert_eq!(
            Standing::of_first(&[0.5, 0.1, 0.9, 0.2]),
            Standing { above: 1, tied: 0 }
        );
        let mut m = MetricSum::default();
        m.add(0);
        m.add(1);
        m.add(10);
        let r = m.mean();
        assert!((r.hr_at_10 - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.ndcg_at_10 - (1.0 + 1.0 / 3f64.log2()) / 3.0).abs() < 1e-12);
        assert!((r.mrr_at_10 - 0.5).abs() < 1e-12);
    }

    #[test]
    fn ties_count_as_a_random_tie_break_in_expectation() {
        // One tie at the top: rank 0 or 1, each half the time.
        let mut m = MetricSum::default();
        m.add_standing(Standing::of_first(&[1.0, 1.0, 0.0]));
        let r = m.mean();
        assert!((r.mrr_at_10 - 0.75).abs() < 1e-12, "{r:?}");
        assert!((r.ndcg_at_10 - (1.0 + 1.0 / 3f64.log2()) / 2.0).abs() < 1e-12);
        // 20 equal scores: HR@10 is 10 of the 20 ranks.
        let mut m = MetricSum::default();
        m.add_standing(Standing::of_first(&[0.5; 20]));
        assert!((m.mean().hr_at_10 - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_score_that_is_not_a_number_never_flatters_the_positive() {
        let nan = f32::NAN;
        assert_eq!(
            Standing::of_first(&[nan, 0.1, 0.2]),
            Standing { above: 2, tied: 0 }
        );
        assert_eq!(
            Standing::of_first(&[nan; 101]),
            Standing {
                above: 100,
                tied: 0
            }
        );
        assert_eq!(
            Standing::of_first(&[0.5, nan, 0.1]),
            Standing { above: 1, tied: 0 }
        );
    }
}
