//! `isolane bench`'s work: latency and throughput of one model on one backend, measured job by
//! job the way a workload runs it (input copy in, forward, output copy out, wait).

use std::time::Instant;

use isolane_engine::saved::{is_saved_plan_path, SavedPlan};
use isolane_engine::{
    build_model, model_info, CompiledModel, CpuBackend, EngineError, Precision, Weights,
};

/// What to measure (the flags of `isolane bench`).
#[derive(Debug, Clone)]
pub struct BenchRequest {
    /// Built-in models, or saved plans (`.isoplan`, loaded instead of compiled).
    pub models: Vec<String>,
    pub batches: Vec<usize>,
    /// Precisions as written; none: fp16 on cuda, fp32 on cpu. `int8` / `fp8`: each model
    /// quantized from `calibration` (at each batch) first, then run at fp16 on cuda (its
    /// products on the int8 / fp8 tensor cores, docs/cuda.md), fp32 on the CPU.
    pub precisions: Vec<String>,
    /// The calibration folder (.npy files or images) of `int8` / `fp8`.
    pub calibration: Option<std::path::PathBuf>,
    /// `percentile` (the default), `entropy` (int8 only) or `minmax`.
    pub calibration_method: Option<String>,
    /// `quantized` (the default: a residual block's skip quantized too) or `float`.
    pub calibration_skips: Option<String>,
    /// `"cuda"` or `"cpu"` (`None`: cuda where it can run, else cpu).
    pub backend: Option<String>,
    /// Timed jobs per configuration.
    pub replays: usize,
    /// Untimed jobs first.
    pub warmup: usize,
    pub gpu: u32,
    /// CPU threads (0 = all cores).
    pub threads: usize,
    /// Seed of the synthetic weights and the input.
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A flag's value (exit code 2 at the CLI).
    #[error("{0}")]
    User(String),
    /// The engine failed, doing what `doing` says.
    #[error("{doing}")]
    Engine {
        doing: String,
        #[source]
        source: EngineError,
    },
    #[error(transparent)]
    Run(#[from] EngineError),
    /// A result could not be passed on (written as JSON).
    #[error("{0}")]
    Output(String),
}

impl BenchError {
    /// Whether this is the user's mistake (exit code 2) rather than a runtime failure.
    pub fn is_user_error(&self) -> bool {
        matches!(self, BenchError::User(_))
    }
}

fn user(msg: impl std::fmt::Display) -> BenchError {
    BenchError::User(msg.to_string())
}

/// The engine's error while doing `what`: a model it cannot take (a malformed graph, an op or
/// precision the backend lacks) is the user's (exit 2); anything else keeps the error whole as
/// the source, so that the CLI tells an out-of-memory (exit 3) from a library failure (1).
fn doing(what: String) -> impl FnOnce(EngineError) -> BenchError {
    move |source| {
        if source.is_bad_model() {
            user(format!("{what}: {source}"))
        } else {
            BenchError::Engine {
                doing: what,
                source,
            }
        }
    }
}

/// One measured configuration.
#[derive(Debug, serde::Serialize)]
pub struct BenchResult {
    pub backend: String,
    pub model: String,
    pub batch: usize,
    pub precision: String,
    pub replays: usize,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub min_ms: f64,
    pub throughput_ips: f64,
    pub compile_ms: f64,
    pub weights_mib: Option<f64>,
    pub arena_mib: f64,
    pub workspace_mib: Option<f64>,
    pub device_mib: Option<f64>,
    /// cuda: device time of the forward alone (no copies), median of 50 event-timed replays.
    pub forward_ms: Option<f64>,
    /// A calibrated int8 / fp8 row on cuda: the plan that runs, its precision's own (`int8`,
    /// `fp8`) or its float fallback (`fp16 fallback`), the faster of the two timed whole
    /// ([`isolane_cuda::CudaBackend::compile_calibrated`]); absent where there was no choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_kept: Option<String>,
    /// The two plans' forwards as that choice timed them (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantized_forward_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float_forward_ms: Option<f64>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn time_jobs(
    m: &mut dyn CompiledModel,
    warmup: usize,
    replays: usize,
) -> Result<(Vec<f64>, f64), EngineError> {
    for _ in 0..warmup {
        m.run()?;
    }
    let mut t = Vec::with_capacity(replays);
    let start = Instant::now();
    for _ in 0..replays {
        let t0 = Instant::now();
        m.run()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let wall = start.elapsed().as_secs_f64();
    t.sort_by(|a, b| a.total_cmp(b));
    Ok((t, wall))
}

/// The results as a table: model, batch, precision, median and p99 latency, throughput and
/// device memory; `wide` adds the backend, mean and min latency, compile time, weights, arena,
/// workspace and the forward's device time.
pub fn results_table(results: &[BenchResult], wide: bool) -> String {
    let o = |v: Option<f64>, d: usize| isolane_report::num(v, d);
    let mut header = vec![
        "model", "batch", "prec", "p50 ms", "p99 ms", "img/s", "dev MiB",
    ];
    if wide {
        header.extend([
            "backend",
            "mean ms",
            "min ms",
            "build ms",
            "wts MiB",
            "arena MiB",
            "ws MiB",
            "fwd ms",
        ]);
    }
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![
                r.model.clone(),
                r.batch.to_string(),
                row_precision(r),
                isolane_report::ms(Some(r.median_ms)),
                isolane_report::ms(Some(r.p99_ms)),
                isolane_report::rate(r.throughput_ips),
                o(r.device_mib, 1),
            ];
            if wide {
                row.extend([
                    r.backend.clone(),
                    isolane_report::ms(Some(r.mean_ms)),
                    isolane_report::ms(Some(r.min_ms)),
                    format!("{:.0}", r.compile_ms),
                    o(r.weights_mib, 1),
                    format!("{:.1}", r.arena_mib),
                    o(r.workspace_mib, 1),
                    isolane_report::ms(r.forward_ms),
                ]);
            }
            row
        })
        .collect();
    let text_columns: &[usize] = if wide { &[0, 2, 7] } else { &[0, 2] };
    if wide {
        isolane_report::wide_table(&header, &rows, text_columns)
    } else {
        isolane_report::plain_table(&header, &rows, text_columns)
    }
}

/// A row's precision as the table shows it: a calibrated row that runs its float fallback
/// says so (`int8→fp16`), since its times are that plan's.
fn row_precision(r: &BenchResult) -> String {
    match &r.plan_kept {
        Some(k) if *k != r.precision => {
            let float = k.strip_suffix(" fallback").unwrap_or(k);
            format!("{}→{float}", r.precision)
        }
        _ => r.precision.clone(),
    }
}

/// The backend to measure on: the one asked for, else cuda where the GPU can run it and the CPU
/// otherwise, with the reason on stderr (the same choice and note as `isolane run`'s
/// quickstart), so that `isolane bench --model resnet18` works on a machine without a GPU.
fn pick_backend(
    asked: Option<&str>,
    gpu_unusable: impl FnOnce() -> Option<String>,
    note: &mut dyn FnMut(String),
) -> String {
    match asked {
        Some(b) => b.to_string(),
        None => match gpu_unusable() {
            Some(why) => {
                note(format!(
                    "note: measuring on the CPU backend: cuda cannot run here ({why})"
                ));
                "cpu".into()
            }
            None => "cuda".into(),
        },
    }
}

/// How int8 / fp8 rows are calibrated (their `qtype` is each row's); the calibration flags
/// without such a row, or such a row without a folder, are the user's mistakes.
fn calibration_options(
    args: &BenchRequest,
    quantized: bool,
) -> Result<isolane_engine::calibrate::CalibOptions, BenchError> {
    use isolane_engine::calibrate::CalibOptions;
    if !quantized {
        let skips = args.calibration_skips.is_some();
        if args.calibration.is_some() || args.calibration_method.is_some() || skips {
            return Err(user(
                "--calibration, --calibration-method and --calibration-skips are for \
                 --precision int8 or fp8",
            ));
        }
        return Ok(CalibOptions::default());
    }
    if args.calibration.is_none() {
        return Err(user(
            "--precision int8 and fp8 need --calibration DIR (a folder of .npy files or images \
             of the model's input)",
        ));
    }
    let method = crate::engine::calib_method(args.calibration_method.as_deref()).map_err(user)?;
    Ok(CalibOptions {
        method,
        residual_skips: crate::engine::residual_skips(args.calibration_skips.as_deref())
            .map_err(user)?,
        ..Default::default()
    })
}

/// Measures every model × batch × precision; `gpu_unusable` says why cuda cannot run here,
/// if it cannot. Each result goes to `measured` as soon as it is known, notes to `note`.
pub fn bench(
    args: &BenchRequest,
    gpu_unusable: impl FnOnce() -> Option<String>,
    note: &mut dyn FnMut(String),
    measured: &mut dyn FnMut(&BenchResult) -> Result<(), BenchError>,
) -> Result<Vec<BenchResult>, BenchError> {
    if args.replays == 0 {
        return Err(user("--replays must be at least 1"));
    }
    let asked = args.backend.is_some();
    let backend = pick_backend(args.backend.as_deref(), gpu_unusable, note);
    let mut precisions = Vec::new();
    let default = [if backend == "cpu" { "fp32" } else { "fp16" }.to_string()];
    let wanted: &[String] = if args.precisions.is_empty() {
        &default
    } else {
        &args.precisions
    };
    let float = if backend == "cpu" {
        Precision::Fp32
    } else {
        Precision::Fp16
    };
    let mut quantized = false;
    for p in wanted {
        let q = match p.as_str() {
            "int8" => Some(isolane_engine::quant::QuantType::Int8),
            "fp8" => Some(isolane_engine::quant::QuantType::Float8E4M3Fn),
            _ => None,
        };
        quantized |= q.is_some();
        precisions.push(match q {
            Some(q) => (float, Some(q), p.clone()),
            None => {
                let f = p.parse::<Precision>().map_err(user)?;
                (f, None, f.to_string())
            }
        });
    }
    let calibration = calibration_options(args, quantized)?;
    for m in &args.models {
        if model_info(m).is_none() && !is_saved_plan_path(m) {
            return Err(user(format!(
                "--model: unknown model `{m}` (see `isolane models`)"
            )));
        }
    }
    if args.batches.contains(&0) {
        return Err(user("--batch must be at least 1"));
    }
    let mut cuda = match backend.as_str() {
        "cuda" => Some(
            isolane_cuda::CudaBackend::new(args.gpu).map_err(doing(format!(
                "{} needs a usable CUDA GPU {}; without one, measure on the CPU with \
                 --backend cpu",
                if asked {
                    "--backend cuda"
                } else {
                    "the cuda backend"
                },
                args.gpu
            )))?,
        ),
        "cpu" => None,
        other => {
            return Err(user(format!(
                "--backend: `{other}` is not a backend (cuda, cpu)"
            )))
        }
    };
    let mut results = Vec::new();
    for name in &args.models {
        isolane_core::files::refuse_device("the model", std::path::Path::new(name))
            .map_err(user)?;
        // A saved plan (`isolane build`) is loaded instead of compiled: its compile time is
        // the load's.
        let saved = if is_saved_plan_path(name) {
            Some(SavedPlan::load(std::path::Path::new(name)).map_err(user)?)
        } else {
            None
        };
        let graph = match &saved {
            Some(s) => s.graph.clone(),
            None => build_model(name, Weights::Synthetic { seed: args.seed })?,
        };
        if saved.is_some() && quantized {
            return Err(user(format!(
                "--precision int8/fp8: {name} is a saved plan, already compiled at its own \
                 precision; bench the model it was built from"
            )));
        }
        let target = |p| match &cuda {
            Some(_) => crate::engine::Target::Cuda {
                gpu: args.gpu,
                precision: p,
            },
            None => crate::engine::Target::Cpu,
        };
        for &batch in &args.batches {
            for &(p, _, _) in &precisions {
                crate::engine::check_batch_fits(&graph, batch, target(p))
                    .map_err(|reason| user(format!("--batch {batch} ({name}, {p}): {reason}")))?;
            }
        }
        for &batch in &args.batches {
            for (p, qtype, label) in &precisions {
                let p = *p;
                // int8 / fp8: the model quantized at this batch (not timed as compile).
                let row_graph = match (qtype, &args.calibration) {
                    (Some(q), Some(dir)) => {
                        let opts = isolane_engine::calibrate::CalibOptions {
                            qtype: *q,
                            ..calibration.clone()
                        };
                        let threads = if args.threads == 0 {
                            std::thread::available_parallelism().map_or(1, |n| n.get())
                        } else {
                            args.threads
                        };
                        let (g, report) = isolane_engine::calibrate::quantize_from_folder(
                            &graph, batch, dir, &opts, threads,
                        )
                        .map_err(|e| user(format!("--calibration {}: {e}", dir.display())))?;
                        let skips = crate::engine::skips_name(opts.residual_skips);
                        note(format!(
                            "{name} batch {batch} {label}: {report}; residual skips {skips}"
                        ));
                        std::borrow::Cow::Owned(g)
                    }
                    _ => std::borrow::Cow::Borrowed(&graph),
                };
                // A row quantized from --calibration just above: its layers may run plain
                // fp16 on cuda (a QDQ file's keep their fake-quant arithmetic).
                let calibrated = qtype.is_some() && args.calibration.is_some();
                if let Some(b) = cuda.take() {
                    let build = b.build_options().for_calibrated(calibrated);
                    cuda = Some(b.with_build_options(build));
                }
                let mut whole: Option<isolane_cuda::WholeModelChoice> = None;
                let t0 = Instant::now();
                let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
                let mut forward_ms = None;
                let (mut model, mem): (Box<dyn CompiledModel>, Option<isolane_cuda::MemoryReport>) =
                    match &cuda {
                        Some(b) => {
                            // Built-in models only: covered by the GPU tests, so no plan check
                            // (it would add a CPU forward pass to every compile), except as an
                            // MPS client with part of the threads, where library kernels
                            // compute wrong results (docs/cuda.md) and a workload is checked
                            // too.
                            let options = isolane_cuda::CompileOptions {
                                plan_check: b.build_options().mps_thread_pct.is_some(),
                                ..Default::default()
                            };
                            let compiling = format!("compiling {name} batch {batch} {p} for cuda");
                            let (mut m, outcome) = match &saved {
                                // A plan built for another batch, precision or GPU is the
                                // user's to rebuild (exit code 2).
                                Some(s) => b
                                    .load_saved(s, name, batch, p)
                                    .map(|m| (m, None))
                                    .map_err(|e| match e {
                                        EngineError::InvalidArgument(m) => user(m),
                                        e => doing(format!("loading {name} batch {batch} {p}"))(e),
                                    }),
                                // Calibrated here: its float plan is built too and the faster
                                // kept (the row says which).
                                None if calibrated => b
                                    .compile_calibrated(&graph, &row_graph, batch, p, &options)
                                    .map(|(m, outcome)| (m, Some(outcome)))
                                    .map_err(doing(compiling)),
                                None => b
                                    .compile_cuda_with(&row_graph, batch, p, &options)
                                    .map(|m| (m, None))
                                    .map_err(doing(compiling)),
                            }?;
                            if let Some(line) =
                                outcome.as_ref().and_then(|o| o.describe(label, p.as_str()))
                            {
                                note(format!("{name} batch {batch} {label}: {line}"));
                            }
                            whole = outcome.and_then(|o| o.timed());
                            let input =
                                crate::seeded_input::random_normal(m.input_mut().len(), args.seed);
                            m.input_mut().copy_from_slice(&input);
                            m.run()?;
                            forward_ms = Some(m.device_ms(50)?);
                            // A measuring aid (docs/cuda.md "Speed"): one replay for a
                            // profiler run with its collection off until this range.
                            if std::env::var_os("ISOLANE_CUDA_PROFILE_REPLAY").is_some() {
                                m.profiled_replay()?;
                            }
                            let mem = m.memory();
                            (Box::new(m), Some(mem))
                        }
                        None => {
                            if let Some(s) = &saved {
                                s.check_key(name, &isolane_engine::saved::cpu_key(p, batch))
                                    .map_err(user)?;
                            }
                            (
                                Box::new(
                                    CpuBackend::new(args.threads)
                                        .compile_cpu(&row_graph, batch, p)
                                        .map_err(doing(format!(
                                            "compiling {name} batch {batch} for cpu"
                                        )))?,
                                ),
                                None,
                            )
                        }
                    };
                let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
                let input = crate::seeded_input::random_normal(model.input_mut().len(), args.seed);
                model.input_mut().copy_from_slice(&input);
                let (t, wall) = time_jobs(model.as_mut(), args.warmup, args.replays)?;
                let r = BenchResult {
                    backend: backend.clone(),
                    model: name.clone(),
                    batch,
                    precision: label.clone(),
                    replays: args.replays,
                    median_ms: percentile(&t, 0.5),
                    p99_ms: percentile(&t, 0.99),
                    mean_ms: t.iter().sum::<f64>() / t.len() as f64,
                    min_ms: t[0],
                    throughput_ips: (args.replays * batch) as f64 / wall,
                    compile_ms,
                    weights_mib: mem.map(|m| mib(m.weights_bytes)),
                    arena_mib: mib(model.arena_bytes()),
                    workspace_mib: mem.map(|m| mib(m.workspace_bytes)),
                    device_mib: mem.map(|m| mib(m.device_delta_bytes)),
                    forward_ms,
                    plan_kept: whole.map(|c| {
                        if c.kept_float {
                            format!("{} fallback", p.as_str())
                        } else {
                            label.clone()
                        }
                    }),
                    quantized_forward_ms: whole.map(|c| c.quantized_ms),
                    float_forward_ms: whole.map(|c| c.float_ms),
                };
                measured(&r)?;
                results.push(r);
            }
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--calibration-method` and `--calibration-skips` become every int8 / fp8 row's
    /// calibration options; either without such a row, or a value of neither, is refused.
    #[test]
    fn the_calibration_flags_become_the_rows_calibration_options() {
        use isolane_engine::calibrate::CalibMethod;
        let request = |method: Option<&str>, skips: Option<&str>| BenchRequest {
            models: vec!["resnet50".into()],
            batches: vec![1],
            precisions: vec!["int8".into()],
            calibration: Some("cal".into()),
            calibration_method: method.map(str::to_string),
            calibration_skips: skips.map(str::to_string),
            backend: Some("cpu".into()),
            replays: 1,
            warmup: 0,
            gpu: 0,
            threads: 1,
            seed: 1,
        };
        let default = calibration_options(&request(None, None), true).unwrap();
        assert!(default.residual_skips);
        assert_eq!(default.method, CalibMethod::Percentile(99.99));
        let asked = calibration_options(&request(Some("minmax"), Some("float")), true).unwrap();
        assert!(!asked.residual_skips);
        assert_eq!(asked.method, CalibMethod::MinMax);
        let quantized = request(None, Some("quantized"));
        assert!(
            calibration_options(&quantized, true)
                .unwrap()
                .residual_skips
        );

        let e = calibration_options(&request(None, Some("bytes")), true).unwrap_err();
        assert!(e.is_user_error());
        assert_eq!(
            e.to_string(),
            "--calibration-skips bytes: expected quantized or float"
        );
        let alone = BenchRequest {
            calibration: None,
            ..request(None, Some("float"))
        };
        let e = calibration_options(&alone, false).unwrap_err();
        assert!(e.is_user_error());
        assert!(
            e.to_string()
                .contains("--calibration-skips are for --precision int8 or fp8"),
            "{e}"
        );
    }

    /// A calibrated row that runs its float fallback says so in the table and in the JSON
    /// (with both plans' times); a row without that choice carries no such fields.
    #[test]
    fn a_row_that_runs_its_float_fallback_says_so() {
        let mut r = BenchResult {
            backend: "cuda".into(),
            model: "vit_b_16".into(),
            batch: 1,
            precision: "int8".into(),
            replays: 10,
            median_ms: 0.5,
            p99_ms: 0.6,
            mean_ms: 0.5,
            min_ms: 0.4,
            throughput_ips: 2000.0,
            compile_ms: 100.0,
            weights_mib: None,
            arena_mib: 1.0,
            workspace_mib: None,
            device_mib: None,
            forward_ms: Some(0.48),
            plan_kept: None,
            quantized_forward_ms: None,
            float_forward_ms: None,
        };
        assert_eq!(row_precision(&r), "int8");
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            !json.contains("plan_kept") && !json.contains("float_forward_ms"),
            "{json}"
        );
        r.plan_kept = Some("int8".into());
        assert_eq!(row_precision(&r), "int8");
        r.plan_kept = Some("fp16 fallback".into());
        r.quantized_forward_ms = Some(0.87);
        r.float_forward_ms = Some(0.48);
        assert_eq!(row_precision(&r), "int8→fp16");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""plan_kept":"fp16 fallback""#), "{json}");
        assert!(json.contains(r#""quantized_forward_ms":0.87"#), "{json}");
        assert!(results_table(&[r], false).contains("int8→fp16"));
    }

    #[test]
    fn a_model_the_engine_cannot_take_is_the_users_and_memory_keeps_its_source() {
        let e = doing("compiling m batch 1 for cpu".into())(EngineError::Unsupported(
            "op `Tile`".into(),
        ));
        assert!(e.is_user_error());
        assert_eq!(
            e.to_string(),
            "compiling m batch 1 for cpu: unsupported: op `Tile`"
        );
        let oom = isolane_engine::OutOfMemory {
            what: "the activation arena".into(),
            memory: "host memory".into(),
            requested_bytes: Some(1 << 30),
            free_bytes: None,
            reported_by: None,
        };
        let e = doing("compiling m batch 64 for cpu".into())(oom.into());
        assert!(!e.is_user_error());
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<EngineError>());
        assert!(
            matches!(source, Some(EngineError::OutOfMemory(_))),
            "{source:?}"
        );
    }
}
