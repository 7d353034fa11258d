//! Deterministic building blocks shared by the generator and the importers:
//! weighted sampling, candidate lists and the synthetic item catalog.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::detmath;
use crate::schema::Item;

/// Inverse-CDF sampler over indices 0..n with given weights.
#[derive(Clone, Debug)]
pub struct Weighted {
    cdf: Vec<f64>,
}

impl Weighted {
    /// From non-negative weights with a positive sum.
    pub fn new(weights: impl IntoIterator<Item = f64>) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = weights
            .into_iter()
            .map(|w| {
                acc += w;
                acc
            })
            .collect();
        assert!(acc > 0.0, "weights must have a positive sum");
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    /// Zipf law over ranks 0..n: weight of rank k is 1/(k+1)^s.
    pub fn zipf(n: usize, s: f64) -> Self {
        Self::new((1..=n).map(|k| 1.0 / detmath::pow(k as f64, s)))
    }

    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    pub fn sample(&self, rng: &mut ChaCha8Rng) -> usize {
        let u = unit(rng);
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// Uniform in [0, 1) with 53 random bits (defined here, not by the rand
/// version, so traces survive a rand upgrade that changes `random::<f64>`).
pub fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.random::<u64>() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Uniform integer in 0..n (n >= 1), by rejection so it has no modulo bias.
pub fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let zone = u64::MAX - u64::MAX % n;
    loop {
        let x = rng.random::<u64>();
        if x < zone {
            return x % n;
        }
    }
}

/// Exponential waiting time with the given rate.
pub fn exponential(rng: &mut ChaCha8Rng, rate: f64) -> f64 {
    -detmath::ln(1.0 - unit(rng)) / rate
}

/// Fisher–Yates shuffle.
pub fn shuffle<T>(v: &mut [T], rng: &mut ChaCha8Rng) {
    for i in (1..v.len()).rev() {
        let j = below(rng, i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// A random permutation of 0..n.
pub fn permutation(n: usize, rng: &mut ChaCha8Rng) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    shuffle(&mut p, rng);
    p
}

/// Candidate list of one request: the true item plus popularity-sampled
/// negatives, de-duplicated and shuffled, `n` long (or every item when the
/// catalog is smaller). `popularity` samples an index into `ids`.
pub fn candidates(
    label: u32,
    n: usize,
    popularity: &Weighted,
    ids: &[u32],
    rng: &mut ChaCha8Rng,
) -> Vec<u32> {
    let n = n.min(ids.len());
    let mut out = Vec::with_capacity(n);
    // Membership by set: `out.contains` made a request of 100,000
    // candidates cost ~1e10 comparisons. The draws are unchanged.
    let mut seen = std::collections::HashSet::with_capacity(n);
    seen.insert(label);
    out.push(label);
    // Popularity sampling; in a catalog not much bigger than `n` the rare
    // items take long to draw, so after a bounded number of tries the rest
    // is filled from a uniform scan.
    let mut tries = 0;
    while out.len() < n && tries < 20 * n {
        let c = ids[popularity.sample(rng)];
        if seen.insert(c) {
            out.push(c);
        }
        tries += 1;
    }
    if out.len() < n {
        let start = below(rng, ids.len() as u64) as usize;
        for k in 0..ids.len() {
            let c = ids[(start + k) % ids.len()];
            if out.len() == n {
                break;
            }
            if seen.insert(c) {
                out.push(c);
            }
        }
    }
    shuffle(&mut out, rng);
    out
}

/// Rows of each embedding table: table 0 is the item id itself; table t ≥ 1
/// is a categorical feature with about items / 10^t values (at least 16).
pub fn table_rows(items: u32, tables: u16) -> Vec<u32> {
    (0..tables)
        .map(|t| match t {
            0 => items,
            t => (items / 10u32.saturating_pow(t as u32).min(items.max(1))).max(16),
        })
        .collect()
}

/// The synthetic item catalog: feature ids for every table (table 0 is the
/// id, the coarser tables a random category), token length 1, and a
/// semantic-ID triplet unique per item.
///
/// The triplet is `code = (id · mult + offset) mod C³` written in base C:
/// with `mult` coprime to C³ this is a bijection, so triplets are unique.
pub fn catalog(items: u32, tables: u16, codebook: u16, rng: &mut ChaCha8Rng) -> Vec<Item> {
    let rows = table_rows(items, tables);
    let c = codebook as u64;
    let space = c * c * c;
    assert!(space >= items as u64, "codebook_size³ must be >= items");
    let mut mult = below(rng, space) | 1;
    while gcd(mult, space) != 1 {
        mult += 2;
    }
    let offset = below(rng, space);
    (0..items)
        .map(|i| {
            let code = ((i as u128 * mult as u128 + offset as u128) % space as u128) as u64;
            let sid = [
                (code / (c * c)) as u16,
                ((code / c) % c) as u16,
                (code % c) as u16,
            ];
            let feature_ids = rows
                .iter()
                .enumerate()
                .map(|(t, &r)| {
                    if t == 0 {
                        i
                    } else {
                        below(rng, r as u64) as u32
                    }
                })
                .collect();
            Item {
                item_id: i,
                feature_ids,
                token_len: 1,
                sid,
            }
        })
        .collect()
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn candidates_hold_the_label_once_and_are_distinct() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let ids: Vec<u32> = (0..150).collect();
        let pop = Weighted::zipf(ids.len(), 1.2);
        for label in [0, 77, 149] {
            let mut c = candidates(label, 100, &pop, &ids, &mut rng);
            assert_eq!(c.len(), 100);
            assert_eq!(c.iter().filter(|&&x| x == label).count(), 1);
            c.sort();
            c.dedup();
            assert_eq!(c.len(), 100);
        }
        // A catalog smaller than n gives every item.
        assert_eq!(
            candidates(3, 100, &Weighted::zipf(10, 1.0), &ids[..10], &mut rng).len(),
            10
        );
    }

    #[test]
    fn catalog_triplets_are_unique_and_features_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let items = catalog(5_000, 4, 20, &mut rng);
        let rows = table_rows(5_000, 4);
        let mut sids: Vec<_> = items.iter().map(|i| i.sid).collect();
        sids.sort();
        sids.dedup();
        assert_eq!(sids.len(), 5_000);
        for it in &items {
            assert!(it.sid.iter().all(|&s| s < 20));
            assert!(it.feature_ids.iter().zip(&rows).all(|(&f, &r)| f < r));
            assert_eq!(it.feature_ids[0], it.item_id);
        }
    }

    #[test]
    fn zipf_prefers_low_ranks() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let z = Weighted::zipf(1000, 1.0);
        let low = (0..10_000).filter(|_| z.sample(&mut rng) < 10).count();
        // P(rank < 10) = H(10)/H(1000) ≈ 0.39.
        assert!((3_500..4_300).contains(&low), "{low}");
    }
}
