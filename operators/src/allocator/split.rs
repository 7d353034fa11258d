//! The per-node static split (`memory.node_alpha`) that a trace rewards
//! most. Where the full grid is affordable (|grid|^nodes splits: 121 for
//! two nodes on an 11-point grid) every split is scored ([`search`]);
//! otherwise (11^8 for a paper preset) by coordinate descent: each node in
//! turn tries every α of the grid while the others hold theirs, and keeps
//! the best; rounds repeat until one changes nothing (a round costs
//! nodes × |grid|). The router couples the nodes (it follows KV and EMB
//! residency), so descent finds a local optimum: on allocator-tight it
//! stopped at an EMB-heavy node 0 where the grid found the reverse split.
//! Both start from the best single α, so neither is worse than that on the
//! scored traces. Pure: the caller's `score` replays the trace.

use std::collections::BTreeMap;

/// What one split scored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Score {
    /// A comparable run: lower is better (the caller's P99).
    Value(f64),
    /// A run that changed answers or lost requests (histories cut short,
    /// failures): never chosen.
    Unusable,
}

/// The search's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitSearch {
    /// The best split found, node 0 first.
    pub alphas: Vec<f64>,
    pub score: f64,
    /// Splits scored (each one replay; repeats are not rerun).
    pub evaluations: usize,
    /// Rounds of descent run, the last of which changed nothing (or
    /// `max_rounds`); 0 for the full grid.
    pub rounds: usize,
}

/// The full grid when it has at most `max_grid` splits, else
/// [`coordinate_descent`] from every node at `start`.
pub fn search<E>(
    nodes: usize,
    start: f64,
    grid: &[f64],
    max_grid: usize,
    max_rounds: usize,
    mut score: impl FnMut(&[f64]) -> Result<Score, E>,
) -> Result<Option<SplitSearch>, E> {
    let splits = u32::try_from(nodes)
        .ok()
        .and_then(|n| grid.len().checked_pow(n));
    if splits.is_none_or(|s| s > max_grid) {
        return coordinate_descent(nodes, start, grid, max_rounds, score);
    }
    let start_split = vec![start; nodes];
    let Score::Value(mut best) = score(&start_split)? else {
        return Ok(None);
    };
    let mut alphas = start_split.clone();
    let mut evaluations = 1;
    // Every split as a number in base |grid|, node 0 the most significant.
    let mut index = vec![0usize; nodes];
    loop {
        let trial: Vec<f64> = index.iter().map(|&i| grid[i]).collect();
        if trial != start_split {
            evaluations += 1;
            // Strictly better only: ties keep the start, then the first.
            if let Score::Value(v) = score(&trial)?
                && v < best
            {
                best = v;
                alphas = trial;
            }
        }
        let mut digit = nodes;
        loop {
            if digit == 0 {
                return Ok(Some(SplitSearch {
                    alphas,
                    score: best,
                    evaluations,
                    rounds: 0,
                }));
            }
            digit -= 1;
            index[digit] += 1;
            if index[digit] < grid.len() {
                break;
            }
            index[digit] = 0;
        }
    }
}

/// Coordinate descent over `grid` for `nodes` nodes, starting with every
/// node at `start` (which must score usable). Ties keep the current α, so
/// the result does not depend on the grid's order among equals.
pub fn coordinate_descent<E>(
    nodes: usize,
    start: f64,
    grid: &[f64],
    max_rounds: usize,
    mut score: impl FnMut(&[f64]) -> Result<Score, E>,
) -> Result<Option<SplitSearch>, E> {
    // Keyed by the split in thousandths, so a split is replayed once.
    let key = |a: &[f64]| -> Vec<i64> { a.iter().map(|x| (x * 1000.0).round() as i64).collect() };
    let mut seen: BTreeMap<Vec<i64>, Score> = BTreeMap::new();
    let mut eval = |a: &[f64], seen: &mut BTreeMap<Vec<i64>, Score>| -> Result<Score, E> {
        if let Some(s) = seen.get(&key(a)) {
            return Ok(*s);
        }
        let s = score(a)?;
        seen.insert(key(a), s);
        Ok(s)
    };
    let mut alphas = vec![start; nodes];
    let Score::Value(mut best) = eval(&alphas, &mut seen)? else {
        return Ok(None);
    };
    let mut rounds = 0;
    while rounds < max_rounds {
        rounds += 1;
        let mut changed = false;
        for node in 0..nodes {
            let mut pick = alphas[node];
            for &a in grid {
                let mut trial = alphas.clone();
                trial[node] = a;
                if let Score::Value(v) = eval(&trial, &mut seen)?
                    && v < best
                {
                    best = v;
                    pick = a;
                }
            }
            if pick != alphas[node] {
                alphas[node] = pick;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Ok(Some(SplitSearch {
        alphas,
        score: best,
        evaluations: seen.len(),
        rounds,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

    fn descend(f: impl Fn(&[f64]) -> Score, nodes: usize, start: f64) -> Option<SplitSearch> {
        coordinate_descent::<()>(nodes, start, &GRID, 5, |a| Ok(f(a))).unwrap()
    }

    #[test]
    fn finds_a_separable_optimum_per_node() {
        // Node 0 wants 0.1, node 1 wants 0.8.
        let f = |a: &[f64]| Score::Value((a[0] - 0.1).powi(2) + (a[1] - 0.8).powi(2));
        let s = descend(f, 2, 0.5).unwrap();
        assert!((s.alphas[0] - 0.1).abs() < 1e-9 && (s.alphas[1] - 0.8).abs() < 1e-9);
        assert!(s.score < 1e-12);
        // One round finds it, a second confirms; a split already scored is
        // not replayed: the start, node 0's pass, node 1's, node 0's again
        // (node 1 now at 0.8); node 1's second pass repeats its first.
        assert_eq!(s.rounds, 2);
        assert_eq!(s.evaluations, 1 + 3 * 10, "{s:?}");
    }

    #[test]
    fn never_worse_than_the_start_and_never_picks_an_unusable_split() {
        // Splits with node 1 above 0.5 are unusable although they score best.
        let f = |a: &[f64]| {
            if a[1] > 0.5 {
                Score::Unusable
            } else {
                Score::Value(1.0 - a[1])
            }
        };
        let s = descend(f, 2, 0.2).unwrap();
        assert!((s.alphas[1] - 0.5).abs() < 1e-9, "{s:?}");
        assert!(s.score <= 0.8);
        // Flat in node 0: ties keep where it started.
        assert!((s.alphas[0] - 0.2).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn an_unusable_start_gives_nothing() {
        assert_eq!(descend(|_| Score::Unusable, 3, 0.3), None);
    }

    #[test]
    fn a_coupled_objective_improves_over_rounds() {
        // The best α of node 1 depends on node 0's, and node 0's moves with
        // node 1's: the first round stops at (0.2, 0.6), the second reaches
        // (0.3, 0.7), the third confirms it.
        let f = |a: &[f64]| Score::Value(10.0 * (a[0] - 0.3).powi(2) + (a[1] - a[0] - 0.4).powi(2));
        let s = descend(f, 2, 0.0).unwrap();
        assert_eq!(s.rounds, 3, "{s:?}");
        assert!(
            (s.alphas[0] - 0.3).abs() < 1e-9 && (s.alphas[1] - 0.7).abs() < 1e-9,
            "{s:?}"
        );
    }

    #[test]
    fn the_full_grid_finds_what_descent_misses() {
        // Two basins: (0.8, 0.1) near the start's descent path, and the
        // better (0.1, 0.8) that descent from 0.1 does not reach.
        let f = |a: &[f64]| {
            let near = (a[0] - 0.8).powi(2) + (a[1] - 0.1).powi(2);
            let far = (a[0] - 0.1).powi(2) + (a[1] - 0.8).powi(2) - 0.05;
            Score::Value(near.min(far) + 0.2 * (a[0] - 0.1).abs() * (a[1] - 0.1).abs())
        };
        let descent = descend(f, 2, 0.1).unwrap();
        let grid = search::<()>(2, 0.1, &GRID, 121, 5, |a| Ok(f(a)))
            .unwrap()
            .unwrap();
        assert!((grid.alphas[0] - 0.1).abs() < 1e-9 && (grid.alphas[1] - 0.8).abs() < 1e-9);
        assert_eq!((grid.evaluations, grid.rounds), (121, 0));
        assert!(grid.score < descent.score, "{grid:?} {descent:?}");
        // Past the budget it descends instead.
        let capped = search::<()>(2, 0.1, &GRID, 120, 5, |a| Ok(f(a)))
            .unwrap()
            .unwrap();
        assert_eq!(capped, descent);
        assert_eq!(
            search::<()>(2, 0.1, &GRID, 121, 5, |_| Ok(Score::Unusable)).unwrap(),
            None
        );
    }

    #[test]
    fn the_scorers_error_stops_the_search() {
        let r = coordinate_descent(2, 0.5, &GRID, 3, |a: &[f64]| {
            if a[0] > 0.8 {
                Err("replay failed")
            } else {
                Ok(Score::Value(a[0]))
            }
        });
        assert_eq!(r, Err("replay failed"));
    }
}
