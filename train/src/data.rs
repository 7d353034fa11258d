//! The interaction sequences of a trace, SASRec's leave-one-out split and
//! the negative samplers of training and evaluation.

use grflow_kernels::history::HistoryCut;
use std::path::Path;

use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::TrainError;
use crate::net::{Sequence, Target};

/// Every user's items in time order, over a dense item space `0..n_items`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    pub n_items: usize,
    pub users: Vec<User>,
    /// The trace's item rows (item `i` is row `i`), written to the model
    /// directory as its item space.
    pub catalog: Vec<grflow_traces::Item>,
    /// The trace's semantic-ID codebook size (from a trace; serving needs
    /// the model's to match it).
    pub codebook_size: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct User {
    pub user_id: u64,
    pub items: Vec<u32>,
    /// The distinct items, sorted (evaluation negatives are drawn outside it).
    seen: Vec<u32>,
    /// The distinct items of the training part, sorted (training negatives
    /// are drawn outside it, as SASRec does: excluding the held-out items
    /// too would tell training which items that user is tested on).
    train_seen: Vec<u32>,
}

fn distinct(items: &[u32]) -> Vec<u32> {
    let mut v = items.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

impl User {
    pub fn new(user_id: u64, items: Vec<u32>) -> Self {
        let mut user = User {
            user_id,
            seen: distinct(&items),
            train_seen: Vec::new(),
            items,
        };
        user.train_seen = distinct(user.train_items());
        user
    }

    /// SASRec's training part: all but the validation and test items (all
    /// items of a user with fewer than 3).
    pub fn train_items(&self) -> &[u32] {
        let n = self.items.len();
        if n < 3 {
            &self.items
        } else {
            &self.items[..n - 2]
        }
    }

    /// History and target of the validation question.
    pub fn valid(&self) -> Option<(&[u32], u32)> {
        let n = self.items.len();
        (n >= 3).then(|| (&self.items[..n - 2], self.items[n - 2]))
    }

    /// History and target of the test question.
    pub fn test(&self) -> Option<(&[u32], u32)> {
        let n = self.items.len();
        (n >= 3).then(|| (&self.items[..n - 1], self.items[n - 1]))
    }

    pub fn has_seen(&self, item: u32) -> bool {
        self.seen.binary_search(&item).is_ok()
    }

    /// An item drawn uniformly from those the user never interacted with
    /// (any item when the user has seen them all): an evaluation negative.
    pub fn negative(&self, n_items: usize, rng: &mut impl Rng) -> u32 {
        draw_outside(&self.seen, n_items, rng)
    }

    /// An item drawn uniformly from those outside the user's training part:
    /// a training negative.
    pub fn training_negative(&self, n_items: usize, rng: &mut impl Rng) -> u32 {
        draw_outside(&self.train_seen, n_items, rng)
    }
}

/// Uniform over `0..n_items` outside the sorted `excluded` (anywhere when
/// it covers every item).
fn draw_outside(excluded: &[u32], n_items: usize, rng: &mut impl Rng) -> u32 {
    loop {
        let i = rng.random_range(0..n_items as u32);
        if excluded.binary_search(&i).is_err() || excluded.len() >= n_items {
            return i;
        }
    }
}

impl Dataset {
    pub fn new(n_items: usize, users: Vec<User>) -> Result<Self, TrainError> {
        if let Some((u, i)) = users.iter().find_map(|u| {
            u.items
                .iter()
                .find(|&&i| i as usize >= n_items)
                .map(|i| (u, i))
        }) {
            return Err(TrainError::Invalid(format!(
                "user {} has item {i}, outside the {n_items} items",
                u.user_id
            )));
        }
        let catalog = (0..n_items as u32)
            .map(|i| grflow_traces::Item {
                item_id: i,
                feature_ids: vec![i],
                token_len: 1,
                sid: [0; 3],
            })
            .collect();
        Ok(Dataset {
            n_items,
            users,
            catalog,
            codebook_size: None,
        })
    }

    /// The users table and item catalog of a trace made by `grflow import`
    /// or `grflow gen-trace`.
    pub fn from_trace(dir: &Path) -> Result<Self, TrainError> {
        let side =
            grflow_connectors::parquet::load_side_tables(dir).map_err(|e| TrainError::Trace {
                dir: dir.to_path_buf(),
                reason: e.to_string(),
            })?;
        let n_items = side.items.len();
        let side_users = side.users;
        if side
            .items
            .iter()
            .enumerate()
            .any(|(i, it)| it.item_id as usize != i)
        {
            return Err(TrainError::Trace {
                dir: dir.to_path_buf(),
                reason: "item ids are not the dense range 0..items".into(),
            });
        }
        // Serving reads the trained row of item i at its table-0 feature id:
        // refused now rather than after the training.
        if let Some((row, it)) = side
            .items
            .iter()
            .enumerate()
            .find(|(_, it)| it.feature_ids.first() != Some(&it.item_id))
        {
            return Err(TrainError::Trace {
                dir: dir.to_path_buf(),
                reason: format!(
                    "items.parquet row {row}: item {} has feature ids {:?}; a trained model \
                     needs item i's first feature id to be i",
                    it.item_id, it.feature_ids
                ),
            });
        }
        let users = side_users
            .into_iter()
            .map(|u| User::new(u.user_id, u.items))
            .collect();
        let mut data = Dataset::new(n_items, users).map_err(|e| TrainError::Trace {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        data.catalog = side.items;
        data.codebook_size = Some(side.meta.codebook_size as usize);
        Ok(data)
    }

    /// FNV-1a over the item count and every sequence: two traces with the
    /// same fingerprint train the same model.
    pub fn fingerprint(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(self.n_items as u64);
        for u in &self.users {
            eat(u.user_id);
            eat(u.items.len() as u64);
            u.items.iter().for_each(|&i| eat(i as u64));
        }
        format!("{h:016x}")
    }

    /// Interactions per item in the training parts (the popularity baseline).
    pub fn train_counts(&self) -> Vec<u64> {
        let mut c = vec![0u64; self.n_items];
        for u in &self.users {
            u.train_items().iter().for_each(|&i| c[i as usize] += 1);
        }
        c
    }
}

/// A user's training sequence: the last `max_history + 1` training items;
/// every item after the first is a target, with the positive first and
/// `negatives` sampled items after it. `None` for fewer than 2 items.
pub fn train_sequence(
    user: &User,
    n_items: usize,
    max_history: usize,
    negatives: usize,
    rng: &mut impl Rng,
) -> Option<Sequence> {
    let s = user.train_items();
    let s = &s[s.len().saturating_sub(max_history + 1)..];
    if s.len() < 2 {
        return None;
    }
    let targets = (1..s.len())
        .map(|t| {
            let mut cands = Vec::with_capacity(negatives + 1);
            cands.push(s[t]);
            cands.extend((0..negatives).map(|_| user.training_negative(n_items, rng)));
            Target { prefix: t, cands }
        })
        .collect();
    Some(Sequence {
        history: s[..s.len() - 1].to_vec(),
        targets,
    })
}

/// SASRec's evaluation question: the history (cut to `max_history`) and
/// the target followed by `negatives` items the user never interacted
/// with, drawn from an RNG of (`seed`, user) so every scorer sees the same.
pub fn eval_question(
    user: &User,
    history: &[u32],
    target: u32,
    n_items: usize,
    cut: HistoryCut,
    negatives: usize,
    seed: u64,
) -> Sequence {
    // Cut as the serving node cuts it: the oldest items go in whole chunks
    // (so that served prefixes stay reusable), leaving 35–50 of 51–66 items
    // at a limit of 50, not the last 50.
    let history = cut.keep(history);
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed ^ user.user_id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut cands = Vec::with_capacity(negatives + 1);
    cands.push(target);
    let unseen = n_items.saturating_sub(user.seen.len());
    if (1..=negatives).contains(&unseen) {
        // A small catalog: drawn with replacement, the copies of a few
        // strong negatives would crowd the target out of every top 10
        // (HR@10 0 on a 12-item catalog). Each unseen item once instead.
        cands.extend((0..n_items as u32).filter(|i| user.seen.binary_search(i).is_err()));
    } else {
        cands.extend((0..negatives).map(|_| user.negative(n_items, &mut rng)));
    }
    Sequence {
        history: history.to_vec(),
        targets: vec![Target {
            prefix: history.len(),
            cands,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_negatives_may_be_held_out_items_evaluation_negatives_never() {
        // Training part [0, 1]; 2 is the validation item, 3 the test item.
        let user = User::new(7, vec![0, 1, 2, 3]);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let train: Vec<u32> = (0..400)
            .map(|_| user.training_negative(5, &mut rng))
            .collect();
        assert!(train.iter().all(|&i| i >= 2), "{train:?}");
        assert!(
            train.contains(&2) && train.contains(&3),
            "held-out items excluded"
        );
        let eval: Vec<u32> = (0..100).map(|_| user.negative(5, &mut rng)).collect();
        assert!(eval.iter().all(|&i| i == 4), "{eval:?}");
    }

    #[test]
    fn a_catalog_smaller_than_the_negatives_asks_each_unseen_item_once() {
        let user = User::new(3, vec![0, 5, 7, 5]);
        let q = eval_question(&user, &[0, 5], 7, 12, HistoryCut::new(50, 16), 100, 1);
        let cands = &q.targets[0].cands;
        assert_eq!(cands, &[7, 1, 2, 3, 4, 6, 8, 9, 10, 11]);
        // A large one keeps SASRec's 100 draws.
        let q = eval_question(&user, &[0, 5], 7, 1_000, HistoryCut::new(50, 16), 100, 1);
        assert_eq!(q.targets[0].cands.len(), 101);
    }

    #[test]
    fn evaluation_histories_are_cut_as_serving_cuts_them() {
        let items: Vec<u32> = (0..70).collect();
        let user = User::new(1, items.clone());
        // At a limit of 50 in 16-token blocks serving drops 16 items at a
        // time: 51 → 35 kept, 66 → 50, 67 → 35 (not always the last 50).
        for (len, kept) in [(40, 40), (50, 50), (51, 35), (66, 50), (67, 35)] {
            let q = eval_question(&user, &items[..len], 99, 100, HistoryCut::new(50, 16), 5, 1);
            assert_eq!(q.history, items[len - kept..len], "{len} items");
            assert_eq!(q.targets[0].prefix, kept);
        }
    }
}
