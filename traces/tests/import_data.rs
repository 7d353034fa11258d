//! Importers on the real datasets in ../shared/data (skipped with a visible
//! reason when a file is absent; nothing of it is copied here).

use grflow_testkit::shared_data;
use grflow_traces::import::import_str;
use grflow_traces::{ImportConfig, ImportFormat, Trace, import};

/// The invariants every imported trace keeps.
fn check(trace: &Trace, interactions: usize) {
    let users_with_history = trace.users.iter().filter(|u| !u.items.is_empty()).count();
    assert_eq!(
        trace.requests.len(),
        interactions - users_with_history,
        "one request per interaction after the first"
    );
    assert_eq!(
        trace.users.iter().map(|u| u.items.len()).sum::<usize>(),
        interactions
    );
    for w in trace.requests.windows(2) {
        assert!(
            (w[0].ts_ms, w[0].user_id) <= (w[1].ts_ms, w[1].user_id),
            "time order, ties by user"
        );
    }
    for (i, r) in trace.requests.iter().enumerate() {
        assert_eq!(r.req_id, i as u64);
        let label = r.label.expect("imported requests are labelled");
        assert_eq!(
            trace.users[r.user_id as usize].items[r.hist_len as usize],
            label
        );
        assert_eq!(r.candidates.len(), 100.min(trace.items.len()));
        assert_eq!(r.candidates.iter().filter(|&&c| c == label).count(), 1);
    }
}

#[test]
fn ml_100k_recbole() {
    let Some(path) = shared_data("ml_100k_recbole", "ml-100k/ml-100k.inter") else {
        return;
    };
    let cfg = ImportConfig {
        format: ImportFormat::Recbole,
        ..ImportConfig::default()
    };
    let trace = import(&path, &cfg).unwrap();
    assert_eq!(trace.users.len(), 943);
    assert_eq!(trace.items.len(), 1_682);
    check(&trace, 100_000);
    // Deterministic.
    let again = import(&path, &cfg).unwrap();
    assert_eq!(trace.requests[..1000], again.requests[..1000]);
    assert_eq!(trace.requests.last(), again.requests.last());
}

#[test]
fn ml_100k_as_movielens_csv_gives_the_same_trace() {
    let Some(path) = shared_data(
        "ml_100k_as_movielens_csv_gives_the_same_trace",
        "ml-100k/ml-100k.inter",
    ) else {
        return;
    };
    // The same interactions rewritten as a GroupLens ratings.csv, in memory.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut csv = String::from("userId,movieId,rating,timestamp\n");
    for line in text.lines().skip(1) {
        csv.push_str(&line.replace('\t', ","));
        csv.push('\n');
    }
    let recbole = import(
        &path,
        &ImportConfig {
            format: ImportFormat::Recbole,
            ..ImportConfig::default()
        },
    )
    .unwrap();
    let movielens = import_str(
        &csv,
        "ratings.csv",
        &ImportConfig {
            format: ImportFormat::Movielens,
            ..ImportConfig::default()
        },
    )
    .unwrap();
    assert_eq!(recbole.requests.len(), movielens.requests.len());
    assert_eq!(recbole.users, movielens.users);
    assert_eq!(recbole.requests[..500], movielens.requests[..500]);
}

#[test]
fn amazon_games_seq() {
    let Some(path) = shared_data("amazon_games_seq", "amazon-games/games.txt") else {
        return;
    };
    let lines = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
    let trace = import(
        &path,
        &ImportConfig {
            format: ImportFormat::Seq,
            ..ImportConfig::default()
        },
    )
    .unwrap();
    check(&trace, lines);
    assert!(
        trace
            .meta
            .as_ref()
            .unwrap()
            .source
            .contains("synthesized timestamps")
    );
    // Synthesized timestamps span lines × 10 ms and interleave users.
    let last = trace.requests.last().unwrap().ts_ms;
    assert!(last < lines as u64 * 10);
    let first_users: std::collections::BTreeSet<u64> =
        trace.requests[..200].iter().map(|r| r.user_id).collect();
    assert!(
        first_users.len() > 100,
        "users interleave: {} distinct in the first 200",
        first_users.len()
    );
}
