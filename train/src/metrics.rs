//! Ranking metrics of one positive among sampled or full candidates.

/// HR@10, NDCG@10 and MRR@10 averaged over questions.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankMetrics {
    pub hr_at_10: f64,
    pub ndcg_at_10: f64,
    pub mrr_at_10: f64,
}

/// The positive's 0-based rank among `scores` (positive at index 0):
/// items scored higher, plus half of the items tied with it (a random
/// tie-break's expectation, so constant scores are not flattered).
pub fn rank_of_first(scores: &[f32]) -> usize {
    let s0 = scores[0];
    let above = scores[1..].iter().filter(|&&s| s > s0).count();
    let tied = scores[1..].iter().filter(|&&s| s == s0).count();
    above + tied / 2
}

/// Accumulates ranks.
#[derive(Clone, Debug, Default)]
pub struct MetricSum {
    n: u64,
    hr: f64,
    ndcg: f64,
    mrr: f64,
}

impl MetricSum {
    pub fn add(&mut self, rank: usize) {
        self.n += 1;
        if rank < 10 {
            self.hr += 1.0;
            self.ndcg += 1.0 / ((rank + 2) as f64).log2();
            self.mrr += 1.0 / (rank + 1) as f64;
        }
    }

    pub fn count(&self) -> u64 {
        self.n
    }

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
        assert_eq!(rank_of_first(&[0.5, 0.1, 0.9, 0.2]), 1);
        assert_eq!(rank_of_first(&[1.0; 5]), 2);
        let mut m = MetricSum::default();
        m.add(0);
        m.add(1);
        m.add(10);
        let r = m.mean();
        assert!((r.hr_at_10 - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.ndcg_at_10 - (1.0 + 1.0 / 3f64.log2()) / 3.0).abs() < 1e-12);
        assert!((r.mrr_at_10 - 0.5).abs() < 1e-12);
    }
}
