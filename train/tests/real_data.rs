//! Long trainings on the research datasets of ../shared/data (never in the
//! repository): run with `cargo test -p grflow-train --release --test
//! real_data -- --ignored --nocapture`. They skip visibly when the data is
//! absent.

use grflow_testkit::shared_data;
use grflow_traces::{ImportConfig, ImportFormat, import};
use grflow_train::data::{Dataset, User};
use grflow_train::eval::{EvalOptions, EvalReport, Subject, evaluate};
use grflow_train::fit::{Quiet, TrainConfig, fit};

fn train_and_eval(test: &str, rel: &str, format: ImportFormat) -> Option<EvalReport> {
    let path = shared_data(test, rel)?;
    let cfg = ImportConfig {
        format,
        tables: 1,
        ..ImportConfig::default()
    };
    let trace = import(&path, &cfg).unwrap();
    let users = trace
        .users
        .into_iter()
        .map(|u| User::new(u.user_id, u.items))
        .collect();
    let mut data = Dataset::new(trace.items.len(), users).unwrap();
    data.catalog = trace.items;
    let tc = TrainConfig::defaults(42);
    let fitted = fit(&data, &tc, None, None, &mut Quiet).unwrap();
    let subject = Subject {
        params: &fitted.params,
        max_history: tc.max_history,
        arch: &tc.arch,
        model_version: "test",
    };
    let r = evaluate(
        subject,
        &data,
        &EvalOptions::default(),
        0.0,
        &mut |_, _, _| {},
    )
    .unwrap();
    eprintln!(
        "{rel}: {} epochs, {:.0} s; {}",
        fitted.history.len(),
        fitted.train_secs,
        serde_json::to_string(&r).unwrap()
    );
    Some(r)
}

#[test]
#[ignore = "trains on Amazon Games (tens of minutes)"]
fn games_reaches_the_sasrec_floor() {
    let Some(r) = train_and_eval(
        "games_reaches_the_sasrec_floor",
        "amazon-games/games.txt",
        ImportFormat::Seq,
    ) else {
        return;
    };
    assert!(r.sampled_100.hr_at_10 >= 0.70, "{:?}", r.sampled_100);
    assert!(r.sampled_100.ndcg_at_10 >= 0.50, "{:?}", r.sampled_100);
    assert!(r.sampled_100.hr_at_10 > r.popularity.sampled_100.hr_at_10);
}

#[test]
#[ignore = "trains on MovieLens 100k (minutes)"]
fn ml100k_beats_popularity() {
    let Some(r) = train_and_eval(
        "ml100k_beats_popularity",
        "ml-100k/ml-100k.inter",
        ImportFormat::Recbole,
    ) else {
        return;
    };
    assert!(r.sampled_100.hr_at_10 > r.popularity.sampled_100.hr_at_10);
    assert!(r.sampled_100.ndcg_at_10 > r.popularity.sampled_100.ndcg_at_10);
}
