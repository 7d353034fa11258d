use super::*;
use grflow_operators::allocator::AllocatorPolicy;

#[test]
fn embedded_default_parses() {
    let cfg = Config::embedded();
    assert_eq!(cfg.run.workers, 2);
    assert_eq!(cfg.run.slo_ms.rank, 30.0);
}

#[test]
fn embedded_file_and_compiled_defaults_agree() {
    // A key left out of a user's file falls back to the compiled default,
    // so the two must not drift apart.
    assert_eq!(Config::embedded(), Config::default());
}

#[test]
fn a_top_k_past_the_beam_width_is_a_warning_naming_both_keys() {
    assert!(Config::embedded().warnings().is_empty());
    let cfg = Config::parse("[model]\nbeam_width = 8\nbeam_top_k = 8\n", "x.toml").unwrap();
    let warnings = cfg.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("model.top_k (10)") && warnings[0].contains("model.beam_width (8)"),
        "{warnings:?}"
    );
}

#[test]
fn unknown_key_is_named() {
    let err = Config::parse("[run]\nworkres = 3\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("x.toml"), "{err}");
    assert!(err.contains("workres"), "{err}");
}

#[test]
fn an_unknown_codec_is_named_with_the_ones_there_are() {
    let err = Config::parse("[kafka]\ncompression = \"brotli\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("brotli") && err.contains("zstd"), "{err}");
    let ok = Config::parse("[kafka]\ncompression = \"lz4\"\n", "x.toml").unwrap();
    assert_eq!(
        ok.kafka.compression,
        grflow_connectors::kafka::Compression::Lz4
    );
}

#[test]
fn unknown_section_is_named() {
    let err = Config::parse("[rn]\nworkers = 3\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("rn"), "{err}");
}

#[test]
fn bad_values_name_their_field() {
    let err = Config::parse("[memory]\nalpha = 1.5\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory.alpha"), "{err}");
    let err = Config::parse("[memory]\nnode_alpha = [0.1, 1.2]\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("memory.node_alpha") && err.contains("value 1"),
        "{err}"
    );
    let err = Config::parse("[memory]\nnode_alpha = []\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory.node_alpha"), "{err}");
    let cfg = Config::parse("[memory]\nalpha = 0.3\nnode_alpha = [0.1, 0.8]\n", "x.toml").unwrap();
    assert_eq!((cfg.start_alpha(0), cfg.start_alpha(1)), (0.1, 0.8));
    assert_eq!(
        Config::embedded().start_alpha(1),
        Config::embedded().memory.alpha
    );
    let err = Config::parse("[run]\nspeed = \"fast\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("run.speed"), "{err}");
    let err = Config::parse("[router]\nmiss_cost_kv = -1.0\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("miss_cost_kv"), "{err}");
    for key in ["router.max_users", "node.max_users", "hotness.max_users"] {
        let (section, field) = key.split_once('.').unwrap();
        let err = Config::parse(&format!("[{section}]\n{field} = 0\n"), "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err}");
    }
}

#[test]
fn unusable_numbers_are_refused_at_load_naming_the_key() {
    // Each of these was accepted and then panicked, aborted, or turned
    // into nonsense later in the run.
    for (text, key) in [
        ("[trace]\nusers = 5\n", "trace.users"),
        ("[trace]\nrequests = 0\n", "trace.requests"),
        ("[trace]\nretrieve_share = 1.5\n", "trace.retrieve_share"),
        ("[trace]\nitems = 20000000\n", "trace.items"),
        ("[trace]\ntables = 60000\n", "trace.tables"),
        ("[trace]\nregime = \"calm\"\n", "trace.regime"),
        ("[memory]\npool_mib = inf\n", "memory.pool_mib"),
        ("[memory]\npool_mib = 1e9\n", "memory.pool_mib"),
        ("[cost]\ncompute_scale = 1e12\n", "cost.compute_scale"),
        (
            "[node]\nservice_tokens_per_ms = 1e-300\n",
            "node.service_tokens_per_ms",
        ),
        ("[run]\nslo_ms = inf\n", "run.slo_ms.rank"),
        ("[link]\nbandwidth_gbps = inf\n", "link.bandwidth_gbps"),
        ("[link]\nbandwidth_gbps = 1e-30\n", "link.bandwidth_gbps"),
        ("[link]\nlatency_us = 2e16\n", "link.latency_us"),
        ("[allocator]\nkp = -0.05\n", "allocator.kp"),
        ("[link]\nlatency_us = -5.0\n", "link.latency_us"),
        ("[link]\nlatency_us = nan\n", "link.latency_us"),
        (
            "[node]\nshard_resident_share = 2.0\n",
            "node.shard_resident_share",
        ),
        ("[node]\ntoken_capacity = inf\n", "node.token_capacity"),
        ("[hotness]\nwindows = 0\n", "hotness.windows"),
        // Allocated up front: these aborted on a failed allocation.
        ("[hotness]\nwindows = 1000000000\n", "hotness.windows"),
        // Within the window bound, but 1.6 GB of counters per router.
        ("[hotness]\nwindows = 1000\n", "hotness.windows"),
        ("[model]\nbeam_width = 100000000\n", "model.beam_width"),
        ("[model]\nbeam_top_k = 100000000\n", "model.beam_top_k"),
        ("[trace]\nregime = \"burst\"\nrps = 1e-300\n", "trace.rps"),
        ("[hotness]\nwindow_ms = 0\n", "hotness.window_ms"),
        // Panicked converting to a Duration.
        ("[batch]\nmax_wait_ms = 1e30\n", "batch.max_wait_ms"),
        ("[batch]\nmax_wait_ms = nan\n", "batch.max_wait_ms"),
        ("[hotness]\nhot_share = -1.0\n", "hotness.hot_share"),
        (
            "[kafka]\nreplication_factor = 0\n",
            "kafka.replication_factor",
        ),
        // Its own answers would come back as requests.
        (
            "[kafka]\nresponse_topic = \"grflow.requests\"\n",
            "kafka.response_topic",
        ),
        (
            "[kafka]\nrequest_topic = \"t\"\ndead_letter_topic = \"t\"\n",
            "kafka.dead_letter_topic",
        ),
    ] {
        let err = Config::parse(text, "x.toml").unwrap_err().to_string();
        assert!(err.contains(key) && err.contains("x.toml"), "{text}: {err}");
    }
    // The trace's own error names the key, not the generator's CLI flag.
    let err = Config::parse("[trace]\nusers = 5\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("--"), "{err}");
    let mut cfg = Config::embedded();
    cfg.trace.candidates = 0;
    let err = cfg.trace.gen_config().unwrap_err();
    assert!(err.starts_with("trace.candidates"), "{err}");
}

#[test]
fn pacing_is_idle_only_for_a_paced_deterministic_replay() {
    let with = |clock: &str, speed: &str, release: &str| {
        Config::parse(
            &format!("[run]\nclock = \"{clock}\"\nspeed = \"{speed}\"\nrelease = \"{release}\"\n"),
            "x.toml",
        )
        .unwrap()
        .replay_pacing_is_idle()
    };
    assert!(with("virtual", "1x", "auto"));
    assert!(with("event", "4x", "complete"));
    assert!(!with("virtual", "max", "auto"));
    assert!(!with("wall", "1x", "auto"));
    // arrival on a model clock: what has arrived depends on the pace.
    assert!(!with("virtual", "1x", "arrival"));
}

#[test]
fn release_auto_follows_the_clock_in_replay_and_is_arrival_in_serve() {
    let mut run = RunConfig::default();
    assert_eq!(run.release, ReleaseSetting::Auto);
    assert_eq!(run.replay_release(), Release::Arrival);
    assert_eq!(run.serve_release(), Release::Arrival);
    run.clock = Clock::Event;
    assert_eq!(run.replay_release(), Release::Complete);
    assert_eq!(run.serve_release(), Release::Arrival);
    let cfg = Config::parse("[run]\nrelease = \"complete\"\n", "x.toml").unwrap();
    assert_eq!(cfg.run.replay_release(), Release::Complete);
    assert_eq!(cfg.run.serve_release(), Release::Complete);
    let err = Config::parse("[run]\nrelease = \"eager\"\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("release"), "{err}");
}

#[test]
fn speed_parses() {
    assert_eq!("max".parse::<Speed>().unwrap(), Speed::Max);
    assert_eq!("4x".parse::<Speed>().unwrap(), Speed::Factor(4.0));
    assert!("0x".parse::<Speed>().is_err());
    // A factor so small its due times overflow a Duration (a worker
    // panicked on it), or so large it is `max`, is refused.
    for s in ["1e-300x", "1e9x", "NaNx", "infx"] {
        assert!(s.parse::<Speed>().is_err(), "{s}");
    }
    assert_eq!("1e-6x".parse::<Speed>().unwrap(), Speed::Factor(1e-6));
}

#[test]
fn shipped_kafka_config_resumes_at_the_committed_offset() {
    // Apache Kafka's behaviour ships; tansu's workaround has its own file,
    // identical but for that one key.
    // The copy built in for `serve` and `send` is configs/kafka.toml.
    let kafka = Config::embedded_kafka();
    assert!(!kafka.kafka.refetch_from_start);
    assert_eq!(kafka.kafka.deadline_ms, 2_000);
    assert_eq!(kafka.kafka.max_future_ms, 60_000);
    let mut tansu = Config::parse(
        include_str!("../../../configs/kafka-tansu.toml"),
        "configs/kafka-tansu.toml",
    )
    .unwrap();
    assert!(tansu.kafka.refetch_from_start);
    tansu.kafka.refetch_from_start = false;
    assert_eq!(tansu, kafka);
}

#[test]
fn the_allocator_preset_is_the_default_with_the_training_shape() {
    let c = Config::parse(
        include_str!("../../../configs/allocator-small.toml"),
        "configs/allocator-small.toml",
    )
    .unwrap();
    let mut d = Config::embedded();
    assert_eq!(d.allocator.policy_file, "configs/allocator-ppo.safetensors");
    assert_eq!(c.allocator.policy, AllocatorPolicy::Smart);
    // What `grflow train-allocator --slo-ms 6.5 --requests 24000 --rps 40`
    // sets on the embedded default, and nothing else.
    d.run.slo_ms = SloMs::both(6.5);
    d.trace.requests = 24_000;
    d.trace.rps = 40.0;
    d.allocator.policy = AllocatorPolicy::Smart;
    // The committed cost model, so the bench is the same everywhere.
    d.cost.calibration = Some("configs/allocator-calibration.json".into());
    assert_eq!(c, d);
}

#[test]
fn the_emb_kv_preset_is_the_allocator_preset_on_a_balanced_device() {
    let c = Config::parse(
        include_str!("../../../configs/allocator-emb.toml"),
        "configs/allocator-emb.toml",
    )
    .unwrap();
    let mut d = Config::parse(
        include_str!("../../../configs/allocator-small.toml"),
        "configs/allocator-small.toml",
    )
    .unwrap();
    d.run.slo_ms = SloMs::both(0.05);
    d.link.bandwidth_gbps = 8.0;
    d.cost.compute_scale = 0.01;
    d.cost.overhead_scale = 0.0;
    d.allocator.policy_file = "configs/allocator-emb-ppo.safetensors".into();
    // About one request in flight at load 1.0 on this device, whose
    // requests take microseconds (the virtual clock's in-flight load).
    d.node.token_capacity = 200.0;
    assert_eq!(c, d);
    // A negative overhead scale is refused by name.
    let bad = Config::parse("[cost]\noverhead_scale = -1.0\n", "bad.toml").unwrap_err();
    assert!(bad.to_string().contains("cost.overhead_scale"), "{bad}");
}

#[test]
fn the_tight_preset_is_the_emb_kv_preset_with_half_the_pool() {
    let c = Config::parse(
        include_str!("../../../configs/allocator-tight.toml"),
        "configs/allocator-tight.toml",
    )
    .unwrap();
    let mut d = Config::parse(
        include_str!("../../../configs/allocator-emb.toml"),
        "configs/allocator-emb.toml",
    )
    .unwrap();
    d.memory.pool_mib = 2.0;
    d.allocator.policy_file = "configs/allocator-tight-ppo.safetensors".into();
    assert_eq!(c, d);
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(&c.allocator.policy_file);
    assert!(policy.exists(), "{}", policy.display());
    // The cost model the policy was trained and benched with, named by
    // the config so that the bench and the trainer use it by default.
    assert_eq!(
        c.cost.calibration.as_deref(),
        Some(std::path::Path::new("configs/allocator-calibration.json"))
    );
    let cost: grflow_kernels::cost::CostModel =
        serde_json::from_str(include_str!("../../../configs/allocator-calibration.json")).unwrap();
    assert_eq!(cost.preset, c.model.preset.as_str());
    assert_eq!(cost.gemm_gflops, 131.7);
}

#[test]
fn the_long_preset_is_the_tight_preset_with_long_histories() {
    let c = Config::parse(
        include_str!("../../../configs/allocator-long.toml"),
        "configs/allocator-long.toml",
    )
    .unwrap();
    let mut d = Config::parse(
        include_str!("../../../configs/allocator-tight.toml"),
        "configs/allocator-tight.toml",
    )
    .unwrap();
    // What its header says it changes, and nothing else.
    d.trace.items = 200_000;
    d.trace.min_history = 100;
    d.trace.max_history = 400;
    d.memory.pool_mib = 12.0;
    d.cost.compute_scale = 0.0015;
    // Its P99 lies under tight's SLO in every window, so it has its own
    // SLO and a policy trained for it.
    d.run.slo_ms = SloMs::both(0.025);
    d.allocator.policy_file = "configs/allocator-long-ppo.safetensors".into();
    assert_eq!(c, d);
    let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(&c.allocator.policy_file);
    assert!(policy.exists(), "{}", policy.display());
}

#[test]
fn paper_presets_parse_as_8_virtual_nodes_at_an_a100_over_pcie_ratio() {
    for (name, text) in [
        (
            "paper-steady",
            include_str!("../../../configs/paper-steady.toml"),
        ),
        (
            "paper-trend",
            include_str!("../../../configs/paper-trend.toml"),
        ),
        (
            "paper-burst",
            include_str!("../../../configs/paper-burst.toml"),
        ),
    ] {
        let c = Config::parse(text, name).unwrap();
        assert_eq!(c.run.workers, 8, "{name}");
        assert_eq!(c.run.clock, Clock::Virtual, "{name}");
        assert_eq!(c.model.preset, "hstu-3l", "{name}");
        assert!(name.ends_with(&c.trace.regime), "{name}");
        // ~130 GFLOP/s / compute_scale over the link: HLEM's 12.5-15.5
        // TFLOP/s per GB/s.
        let ratio = 130e9 / c.cost.compute_scale / (c.link.bandwidth_gbps * 1e9) / 1e3;
        assert!((12.0..=15.5).contains(&ratio), "{name}: {ratio}");
    }
}

#[test]
fn kafka_hardening_keys_default_and_validate() {
    let k = Config::parse("", "x.toml").unwrap().kafka;
    assert_eq!(
        (
            k.max_future_ms,
            k.produce_retries,
            k.produce_retry_backoff_ms,
            k.drain_timeout_ms,
            k.repeat_window
        ),
        (60_000, 5, 100, 30_000, 100_000)
    );
    let err = Config::parse("[kafka]\nrepeat_window = 200000000\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kafka.repeat_window"), "{err}");
    let err = Config::parse("[kafka]\ndrain_timeout_ms = 0\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kafka.drain_timeout_ms"), "{err}");
}

/// `[kafka.librdkafka]` passes properties through, but not over the ones
/// the delivery guarantee rests on: each refused names the key and why.
#[test]
fn librdkafka_properties_the_guarantee_rests_on_are_refused_by_name() {
    for (key, value, why) in [
        ("acks", "1", "in-sync replicas"),
        ("request.required.acks", "0", "in-sync replicas"),
        ("enable.idempotence", "false", "twice"),
        ("message.timeout.ms", "30000", "outage"),
        ("delivery.timeout.ms", "30000", "outage"),
        ("enable.auto.commit", "true", "durable"),
        ("enable.auto.offset.store", "true", "durable"),
        ("auto.offset.reset", "latest", "skip"),
        ("auto.offset.reset", "error", "stop reading"),
        ("group.id", "other", "kafka.group_id"),
    ] {
        let text = format!("[kafka.librdkafka]\n\"{key}\" = \"{value}\"\n");
        let err = Config::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(
            err.contains(&format!("kafka.librdkafka.\"{key}\"")) && err.contains(why),
            "{text}: {err}"
        );
    }
    // grflow's own values, their spellings, and everything else pass.
    let ok = Config::parse(
        "[kafka.librdkafka]\n\"acks\" = \"-1\"\n\"enable.idempotence\" = \"TRUE\"\n\
         \"message.timeout.ms\" = \"0\"\n\"enable.auto.commit\" = \"false\"\n\
         \"auto.offset.reset\" = \"smallest\"\n\"fetch.wait.max.ms\" = \"500\"\n\
         \"isolation.level\" = \"read_uncommitted\"\n\"security.protocol\" = \"ssl\"\n",
        "x.toml",
    )
    .unwrap();
    assert_eq!(ok.kafka.librdkafka.len(), 8);
}

#[test]
fn empty_file_means_defaults() {
    let cfg = Config::parse("", "empty.toml").unwrap();
    assert_eq!(cfg.memory, MemorySection::default());
}

#[test]
fn relative_inputs_are_found_from_the_current_directory_or_beside_the_config() {
    let dir = std::env::temp_dir().join(format!("grflow-config-paths-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("models")).unwrap();
    std::fs::write(dir.join("calib.json"), "{}").unwrap();
    std::fs::write(dir.join("models/policy.safetensors"), "").unwrap();
    // Tests run in the crate's directory, which holds Cargo.toml.
    let text = "[cost]\ncalibration = \"calib.json\"\n\
                [allocator]\npolicy_file = \"models/policy.safetensors\"\n\
                [kafka]\ncatalog = \"Cargo.toml\"\n\
                [model]\nweights = \"nowhere\"\n";
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    let cfg = Config::load(&path).unwrap();
    // Only beside the config: taken from there.
    assert_eq!(cfg.cost.calibration, Some(dir.join("calib.json")));
    assert_eq!(
        std::path::PathBuf::from(&cfg.allocator.policy_file),
        dir.join("models/policy.safetensors")
    );
    // Found from the current directory: kept as written.
    assert_eq!(cfg.kafka.catalog, "Cargo.toml");
    // Found nowhere: kept, so the error names the path as written.
    assert_eq!(cfg.model.weights, Some("nowhere".into()));

    // The shipped layout run from elsewhere: `configs/X` named by a config
    // in `configs/` is found by its name beside the config.
    std::fs::create_dir_all(dir.join("configs")).unwrap();
    std::fs::write(dir.join("configs/shipped.json"), "{}").unwrap();
    let shipped = "[cost]\ncalibration = \"configs/shipped.json\"\n";
    std::fs::write(dir.join("configs/job.toml"), shipped).unwrap();
    let cfg = Config::load(&dir.join("configs/job.toml")).unwrap();
    assert_eq!(cfg.cost.calibration, Some(dir.join("configs/shipped.json")));
    // That folder copied under another name finds its own copy.
    std::fs::create_dir_all(dir.join("copied")).unwrap();
    std::fs::write(dir.join("copied/shipped.json"), "{}").unwrap();
    std::fs::write(dir.join("copied/job.toml"), shipped).unwrap();
    let cfg = Config::load(&dir.join("copied/job.toml")).unwrap();
    assert_eq!(cfg.cost.calibration, Some(dir.join("copied/shipped.json")));
    // A path from the folder above the config's.
    std::fs::create_dir_all(dir.join("runs")).unwrap();
    let above = "[cost]\ncalibration = \"models/policy.safetensors\"\n";
    std::fs::write(dir.join("runs/job.toml"), above).unwrap();
    let cfg = Config::load(&dir.join("runs/job.toml")).unwrap();
    assert_eq!(
        cfg.cost.calibration,
        Some(dir.join("models/policy.safetensors"))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_toml_error_is_one_line_with_its_position_and_the_line() {
    let text = "[run]\nspeed = \"max\"\nworkers = \"two\"\n";
    let err = Config::parse(text, "x.toml").unwrap_err().to_string();
    assert!(
        err.starts_with("config x.toml: line 3, column 11 (`workers = \"two\"`): invalid type"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    let err = Config::parse("[run]\nworkerz = 2\n", "x.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("line 2, column 1 (`workerz = 2`): unknown field `workerz`"),
        "{err}"
    );
}

#[test]
fn worker_and_lane_counts_are_bounded() {
    for (toml, key) in [
        ("[run]\nworkers = 0\n", "run.workers"),
        ("[run]\nworkers = 2000\n", "run.workers"),
        ("[node]\nlanes = 65\n", "node.lanes"),
    ] {
        let err = Config::parse(toml, "x.toml").unwrap_err().to_string();
        assert!(err.contains(key) && err.contains("1..="), "{toml}: {err}");
    }
    let ok = Config::parse("[run]\nworkers = 1024\n[node]\nlanes = 64\n", "x.toml").unwrap();
    assert_eq!((ok.run.workers, ok.node.lanes), (MAX_WORKERS, MAX_LANES));
}
