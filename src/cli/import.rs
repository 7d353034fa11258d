//! `grflow import`: converts a public dataset into a trace directory.

use std::path::PathBuf;
use std::time::Instant;

use grflow_traces::{ImportConfig, ImportFormat, import};

use super::InputError;
use super::gen_trace::{Progress, write_and_summarise};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input format: recbole (.inter), movielens (ratings.csv) or seq (`user item` lines).
    #[arg(long)]
    pub format: ImportFormat,
    /// Dataset file.
    #[arg(long)]
    pub input: PathBuf,
    /// Trace directory to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the negative sampling and the synthetic item features.
    #[arg(long, default_value_t = ImportConfig::default().seed)]
    pub seed: u64,
    /// Embedding tables T of the item catalog (table 0 is the item id).
    #[arg(long, default_value_t = ImportConfig::default().tables)]
    pub tables: u16,
    /// Candidates per request: the true item plus popularity-sampled negatives.
    #[arg(long, default_value_t = ImportConfig::default().candidates)]
    pub candidates: usize,
    /// Rows per row group of requests.parquet.
    #[arg(long, default_value_t = grflow_traces::DEFAULT_ROW_GROUP_ROWS)]
    pub row_group_rows: usize,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.row_group_rows == 0 {
        return Err(InputError::from_display(
            "--row-group-rows must be >= 1 (got 0)",
        ));
    }
    if args.tables == 0 {
        return Err(InputError::from_display("--tables must be >= 1 (got 0)"));
    }
    if args.candidates == 0 {
        return Err(InputError::from_display(
            "--candidates must be >= 1 (got 0)",
        ));
    }
    let cfg = ImportConfig {
        format: args.format,
        seed: args.seed,
        tables: args.tables,
        candidates: args.candidates,
        ..ImportConfig::default()
    };
    super::gen_trace::check_not_a_model(&args.out)?;
    // Removed again if the run fails: no empty or half-written trace.
    let out = super::OutDir::create(&args.out)?;
    let start = Instant::now();
    let progress = Progress::new(args.quiet);
    progress.stage(format!(
        "reading {} ({})",
        args.input.display(),
        args.format.as_str()
    ));
    let trace = import(&args.input, &cfg).map_err(InputError::from_display)?;
    write_and_summarise(&args.out, &trace, args.row_group_rows, &progress, start)?;
    out.keep();
    Ok(())
}
