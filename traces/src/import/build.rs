//! From raw interactions to a trace: dense ids, event order, requests with
//! popularity-sampled negatives, synthetic item catalog.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{ImportConfig, ImportError, RawEvents};
use crate::generate::{MAX_REQUESTS, check_candidate_ids, check_feature_ids};
use crate::sampling::{Weighted, candidates, catalog, table_rows};
use crate::schema::{Mode, Request, Trace, TraceMeta, UserHistory};

/// Sort key of a raw id: numbers in numeric order, before any text id.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum RawKey<'a> {
    Num(u64),
    Text(&'a str),
}

fn raw_key(s: &str) -> RawKey<'_> {
    s.parse().map_or(RawKey::Text(s), RawKey::Num)
}

/// Dense ids: `remap[interned index]` = rank of the raw id in raw-id order.
/// Raw ids that read as the same number ("7", "07", "+7") are distinct ids
/// ordered by their text, so the mapping never depends on file order.
fn dense_ids(names: &[String]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..names.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&names[a as usize], &names[b as usize]);
        raw_key(a).cmp(&raw_key(b)).then_with(|| a.cmp(b))
    });
    let mut remap = vec![0u32; names.len()];
    for (dense, &interned) in order.iter().enumerate() {
        remap[interned as usize] = dense as u32;
    }
    remap
}

/// Builds the trace from parsed interactions.
pub fn build_trace(raw: RawEvents, name: &str, cfg: &ImportConfig) -> Result<Trace, ImportError> {
    let refuse = |reason: String| ImportError::Config {
        file: name.to_string(),
        reason,
    };
    check_sizes(&raw, cfg).map_err(refuse)?;
    let n_items = raw.items.len();
    let events = dense_events(&raw);
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let items = catalog(n_items as u32, cfg.tables, cfg.codebook_size, &mut rng);
    let (requests, histories) = replayed(&events, raw.users.len(), n_items, cfg, &mut rng);
    if requests.is_empty() {
        // Every user interacted once: nothing to replay or train on.
        return Err(refuse(format!(
            "no user has a second interaction ({} interactions of {} users), so no request \
             has a history to condition on",
            events.len(),
            raw.users.len()
        )));
    }
    let users = UserHistory::numbered(histories);
    let file = std::path::Path::new(name)
        .file_name()
        .map_or(name.to_string(), |f| f.to_string_lossy().into_owned());
    Ok(Trace {
        meta: Some(TraceMeta {
            n_tables: cfg.tables,
            table_rows: table_rows(n_items as u32, cfg.tables),
            codebook_size: cfg.codebook_size,
            source: format!(
                "grflow import --format {} --input {file} --seed {} --tables {} --candidates {}: \
                 {} interactions, {} users, {} items{}",
                cfg.format.as_str(),
                cfg.seed,
                cfg.tables,
                cfg.candidates,
                events.len(),
                raw.users.len(),
                n_items,
                if raw.timed {
                    ""
                } else {
                    ", synthesized timestamps"
                }
            ),
        }),
        requests,
        users,
        items,
    })
}

/// The settings and the file's size against what a trace can hold, before
/// anything is allocated: every user's first interaction starts the
/// history and each later one is a request, and both the catalog and the
/// requests' candidates are held in memory (the generator's limits).
fn check_sizes(raw: &RawEvents, cfg: &ImportConfig) -> Result<(), String> {
    if cfg.candidates == 0 {
        return Err("--candidates must be >= 1 (got 0)".into());
    }
    if cfg.tables == 0 {
        return Err("--tables must be >= 1 (got 0)".into());
    }
    let n_items = raw.items.len();
    let mut seen = vec![false; raw.users.len()];
    let firsts = raw
        .events
        .iter()
        .filter(|&&(_, u, _)| !std::mem::replace(&mut seen[u as usize], true))
        .count();
    let n_requests = (raw.events.len() - firsts) as u64;
    check_feature_ids(n_items as u64, cfg.tables).map_err(|e| e.to_string())?;
    if n_requests > MAX_REQUESTS {
        return Err(format!(
            "{n_requests} requests (interactions after each user's first) are more than the \
             {MAX_REQUESTS} a trace holds in memory; import a part of the file"
        ));
    }
    check_candidate_ids(n_requests, cfg.candidates).map_err(|e| e.to_string())?;
    if (cfg.codebook_size as u64).pow(3) < n_items as u64 {
        return Err(format!(
            "{n_items} items do not fit a codebook of {}³ semantic ids",
            cfg.codebook_size
        ));
    }
    Ok(())
}

/// The interactions on dense ids, in event order; equal timestamps by
/// (timestamp, user_id, item_id), everywhere in grflow.
fn dense_events(raw: &RawEvents) -> Vec<(u64, u32, u32)> {
    let (user_of, item_of) = (dense_ids(&raw.users), dense_ids(&raw.items));
    let mut events: Vec<(u64, u32, u32)> = raw
        .events
        .iter()
        .map(|&(ts, u, i)| (ts, user_of[u as usize], item_of[i as usize]))
        .collect();
    events.sort_unstable();
    events
}

/// Replays `events` in order: each interaction after a user's first is a
/// rank request labelled with its item, against negatives sampled by
/// popularity; returns the requests and every user's whole history.
fn replayed(
    events: &[(u64, u32, u32)],
    n_users: usize,
    n_items: usize,
    cfg: &ImportConfig,
    rng: &mut ChaCha8Rng,
) -> (Vec<Request>, Vec<Vec<u32>>) {
    let mut counts = vec![0u64; n_items];
    for &(_, _, i) in events {
        counts[i as usize] += 1;
    }
    let popularity = Weighted::new(counts.iter().map(|&c| c as f64));
    let ids: Vec<u32> = (0..n_items as u32).collect();
    let mut histories: Vec<Vec<u32>> = vec![Vec::new(); n_users];
    let mut requests = Vec::new();
    for &(ts_ms, user, item) in events {
        let history = &mut histories[user as usize];
        // A user's first interaction has no history to condition on.
        if !history.is_empty() {
            requests.push(Request {
                ts_ms,
                req_id: requests.len() as u64,
                user_id: user as u64,
                hist_len: history.len() as u32,
                candidates: candidates(item, cfg.candidates, &popularity, &ids, rng),
                mode: Mode::Rank,
                label: Some(item),
            });
        }
        history.push(item);
    }
    (requests, histories)
}

#[cfg(test)]
mod tests {
    use super::super::{ImportFormat, import_str};
    use super::*;

    const INTER: &str = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n\
        20\t100\t5\t3\n10\t300\t4\t1\n10\t100\t3\t2\n20\t200\t1\t3\n9\t300\t2\t3\n10\t200\t2\t5\n";

    #[test]
    fn a_dataset_of_single_interactions_is_refused() {
        let text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n\
            1\t100\t5\t3\n2\t300\t4\t1\n";
        let err = import_str(text, "x.inter", &ImportConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("no user has a second interaction"), "{err}");
    }

    #[test]
    fn ids_are_dense_in_raw_order_and_events_in_time_order() {
        let cfg = ImportConfig {
            candidates: 3,
            ..ImportConfig::default()
        };
        let t = import_str(INTER, "x.inter", &cfg).unwrap();
        // Users 9, 10, 20 -> 0, 1, 2; items 100, 200, 300 -> 0, 1, 2.
        assert_eq!(t.users[1].items, [2, 0, 1], "user 10: 300@1, 100@2, 200@5");
        assert_eq!(
            t.users[2].items,
            [0, 1],
            "user 20 at ts 3: items 100 then 200"
        );
        assert_eq!(t.users[0].items, [2]);
        // Requests: user 10 @2 (hist 1), user 20 @3 item 200 (hist 1), user 10 @5 (hist 2).
        let got: Vec<_> = t
            .requests
            .iter()
            .map(|r| (r.ts_ms, r.user_id, r.hist_len, r.label))
            .collect();
        assert_eq!(
            got,
            [
                (2_000, 1, 1, Some(0)),
                (3_000, 2, 1, Some(1)),
                (5_000, 1, 2, Some(1))
            ]
        );
        for (i, r) in t.requests.iter().enumerate() {
            assert_eq!(r.req_id, i as u64);
            assert_eq!(r.candidates.len(), 3);
            assert!(r.candidates.contains(&r.label.unwrap()));
            assert_eq!(
                t.users[r.user_id as usize].items[r.hist_len as usize],
                r.label.unwrap()
            );
        }
        assert_eq!(t.items.len(), 3);
        let meta = t.meta.unwrap();
        assert_eq!(meta.table_rows[0], 3);
        // The source names every flag that shaped the trace.
        assert!(
            meta.source.starts_with(
                "grflow import --format recbole --input x.inter --seed 42 --tables 4 --candidates 3:"
            ),
            "{}",
            meta.source
        );
    }

    #[test]
    fn formats_agree_on_the_same_interactions() {
        let csv = "userId,movieId,rating,timestamp\n20,100,5,3\n10,300,4,1\n10,100,3,2\n20,200,1,3\n9,300,2,3\n10,200,2,5\n";
        let cfg = ImportConfig {
            candidates: 3,
            ..ImportConfig::default()
        };
        let a = import_str(INTER, "x", &cfg).unwrap();
        let b = import_str(
            csv,
            "x",
            &ImportConfig {
                format: ImportFormat::Movielens,
                ..cfg.clone()
            },
        )
        .unwrap();
        assert_eq!(a.requests, b.requests);
        assert_eq!(a.users, b.users);
    }

    #[test]
    fn ids_that_read_as_one_number_map_the_same_in_any_line_order() {
        // "7", "07" and "+7" are three users (and items) that parse as 7.
        let lines = ["7 a", "07 b", "+7 c", "7 07", "07 +7", "+7 7", "7 b"];
        let cfg = ImportConfig {
            format: ImportFormat::Seq,
            candidates: 2,
            ..ImportConfig::default()
        };
        let text = |order: &[usize]| -> String {
            order.iter().map(|&i| format!("{}\n", lines[i])).collect()
        };
        // Each user's own lines keep their order (seq is per-user ordered).
        let a = import_str(&text(&[0, 1, 2, 3, 4, 5, 6]), "s.txt", &cfg).unwrap();
        let b = import_str(&text(&[2, 1, 5, 4, 0, 3, 6]), "s.txt", &cfg).unwrap();
        assert_eq!(a.users, b.users);
        // Text order among equal numbers: "+7" < "07" < "7".
        let items = |t: &Trace| t.users.iter().map(|u| u.items.clone()).collect::<Vec<_>>();
        // Items: +7, 07, 7 -> 0, 1, 2; then a, b, c -> 3, 4, 5.
        assert_eq!(items(&a), [vec![5, 2], vec![4, 0], vec![3, 1, 4]]);
    }

    #[test]
    fn catalogs_and_candidates_past_the_generators_limits_are_refused() {
        // 20,000 items × 65,535 tables: used to abort allocating.
        let mut seq = String::new();
        for i in 0..20_000 {
            seq += &format!("u{} i{i}\n", i % 50);
        }
        let cfg = ImportConfig {
            format: ImportFormat::Seq,
            tables: 65_535,
            ..ImportConfig::default()
        };
        let err = import_str(&seq, "big.txt", &cfg).unwrap_err().to_string();
        assert!(
            err.starts_with("big.txt: --tables must be such that items × tables"),
            "{err}"
        );
        assert!(err.contains("65535 with 20000 items"), "{err}");
        // 19,950 requests (50 users' first lines start histories) × 60,000
        // candidates: more than a trace holds.
        let cfg = ImportConfig {
            format: ImportFormat::Seq,
            candidates: 60_000,
            ..ImportConfig::default()
        };
        let err = import_str(&seq, "big.txt", &cfg).unwrap_err().to_string();
        assert!(
            err.starts_with("big.txt: --candidates must be such that requests × candidates"),
            "{err}"
        );
        assert!(err.contains("60000 with 19950 requests"), "{err}");
        for (cfg, flag) in [
            (
                ImportConfig {
                    tables: 0,
                    ..ImportConfig::default()
                },
                "--tables",
            ),
            (
                ImportConfig {
                    candidates: 0,
                    ..ImportConfig::default()
                },
                "--candidates",
            ),
        ] {
            let err = import_str(INTER, "x.inter", &cfg).unwrap_err().to_string();
            assert!(err.contains(&format!("{flag} must be >= 1")), "{err}");
        }
    }

    #[test]
    fn text_ids_sort_after_numbers() {
        let seq = "u2 b\nu1 a\nu1 c\n7 a\n";
        let cfg = ImportConfig {
            format: ImportFormat::Seq,
            candidates: 2,
            ..ImportConfig::default()
        };
        let t = import_str(seq, "s.txt", &cfg).unwrap();
        // Users 7, u1, u2 -> 0, 1, 2; items a, b, c -> 0, 1, 2.
        assert_eq!(
            t.users.iter().map(|u| u.items.clone()).collect::<Vec<_>>(),
            [vec![0], vec![0, 2], vec![1]]
        );
        assert_eq!(t.requests.len(), 1);
    }
}
