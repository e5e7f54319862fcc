//! The sampler against a fake device: timing, stop, CSV, energy, summary and CPU accounting.

use super::*;

/// A fake GPU: readings from a function of the read count; optionally burns CPU per read to
/// stand for an expensive driver call.
struct Fake {
    n: u64,
    burn: Duration,
    f: fn(u64) -> Reading,
}

impl Source for Fake {
    fn device(&self) -> String {
        "Fake GPU".into()
    }
    fn kind(&self) -> &'static str {
        "fake"
    }
    fn read(&mut self) -> Reading {
        if !self.burn.is_zero() {
            let end = thread_cpu_ns() + self.burn.as_nanos() as i64;
            while thread_cpu_ns() < end {
                std::hint::spin_loop();
            }
        }
        self.n += 1;
        (self.f)(self.n - 1)
    }
}

fn steady(k: u64) -> Reading {
    Reading {
        power_w: Some(100.0 + k as f64),
        energy_counter_mj: Some(1_000 * k),
        sm_clock_mhz: Some(1980.0),
        temperature_c: Some(40.0 + k as f64),
        throttle_reasons: Some(if k == 2 { 0x4 } else { 0 }),
        ..Reading::default()
    }
}

fn fake(burn: Duration) -> Box<dyn Source> {
    Box::new(Fake {
        n: 0,
        burn,
        f: steady,
    })
}

fn sample(t_ms: i64, power: Option<f64>, counter: Option<u64>) -> Sample {
    Sample {
        t_ns: t_ms * 1_000_000,
        reading: Reading {
            power_w: power,
            energy_counter_mj: counter,
            ..Reading::default()
        },
    }
}

fn recording(samples: Vec<Sample>) -> Recording {
    Recording {
        device: "Fake GPU".into(),
        source: "fake",
        period: Duration::from_millis(100),
        samples,
        cpu_ns: 1_000_000,
        wall_ns: 1_000_000_000,
        overruns: 0,
        refresh_every: Vec::new(),
    }
}

#[test]
fn expensive_queries_are_refreshed_less_often_to_fit_the_budget() {
    use crate::refresh_every;
    // Cheap queries fit: everything every reading.
    assert_eq!(refresh_every(&[10, 20, 30], 100, 128), vec![1, 1, 1]);
    // One query costs 20× the budget on its own: only it slows, to the next power of two that
    // fits beside the others (10 + 10 + 2000/32 = 82.5 ≤ 100).
    assert_eq!(refresh_every(&[10, 10, 2000], 100, 128), vec![1, 1, 32]);
    // Measured shape on the H100 (µs): power and energy stay at every reading.
    let e = refresh_every(&[30, 40, 30, 30, 30, 30, 60, 60, 2500, 1500], 350, 128);
    assert_eq!(&e[..2], &[1, 1], "{e:?}");
    let load: f64 = [30, 40, 30, 30, 30, 30, 60, 60, 2500, 1500]
        .iter()
        .zip(&e)
        .map(|(&c, &k)| c as f64 / f64::from(k))
        .sum();
    assert!(load <= 350.0, "{e:?} → {load}");
    // Nothing can fit: every query ends at the cap instead of looping forever.
    assert_eq!(refresh_every(&[1000, 1000], 1, 8), vec![8, 8]);
}

#[test]
fn samples_on_an_absolute_period_until_stopped() {
    let s = Sampler::start(fake(Duration::ZERO), Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_millis(205));
    let rec = s.stop().unwrap();
    let n = rec.samples.len();
    // 21 on an idle machine; a loaded CI machine may delay wake-ups but the schedule is
    // absolute, so samples are never more than one per period.
    assert!((8..=22).contains(&n), "{n} samples in 205 ms at 10 ms");
    let t0 = rec.samples[0].t_ns;
    for (k, s) in rec.samples.iter().enumerate().skip(1) {
        let slot = (s.t_ns - t0) as f64 / 10e6;
        assert!(
            slot >= k as f64 - 0.5,
            "sample {k} at slot {slot:.2}: early"
        );
    }
    assert_eq!(rec.source, "fake");
    assert_eq!(rec.device, "Fake GPU");
}

#[test]
fn stop_wakes_the_thread_at_once_and_dropping_joins_it() {
    let s = Sampler::start(fake(Duration::ZERO), Duration::from_secs(30)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let t = std::time::Instant::now();
    let rec = s.stop().unwrap();
    // Far below the 30 s period, with room for a VM stall of a few seconds.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(
        rec.samples.len(),
        1,
        "first reading at once, then a 30 s wait"
    );
    let s = Sampler::start(fake(Duration::ZERO), Duration::from_secs(30)).unwrap();
    let t = std::time::Instant::now();
    drop(s);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn cpu_cost_is_the_threads_own_cpu_time() {
    // 2 ms of CPU per reading every 10 ms: about 20 % of a core.
    let s = Sampler::start(fake(Duration::from_millis(2)), Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let rec = s.stop().unwrap();
    let reads = rec.samples.len() as f64;
    let cpu_ms = rec.cpu_ns as f64 / 1e6;
    assert!(
        cpu_ms >= 2.0 * reads,
        "{cpu_ms} ms CPU for {reads} reads of 2 ms"
    );
    assert!(
        cpu_ms < 2.0 * reads + 20.0,
        "{cpu_ms} ms CPU for {reads} reads"
    );
    let pct = rec.cpu_pct();
    assert!((5.0..=60.0).contains(&pct), "{pct} %");
    // A cheap source costs next to nothing (the goal is < 1 % of a core at 50 ms).
    let s = Sampler::start(fake(Duration::ZERO), Duration::from_millis(10)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let rec = s.stop().unwrap();
    assert!(rec.cpu_pct() < 5.0, "{} %", rec.cpu_pct());
    assert_eq!(rec.summary(None).sampler_cpu_pct, rec.cpu_pct());
}

#[test]
fn energy_from_counter_deltas() {
    let s = vec![
        sample(0, Some(100.0), Some(1_000)),
        sample(100, Some(100.0), Some(2_000)),
        sample(200, Some(100.0), Some(3_500)),
    ];
    let (c, src) = cumulative_energy_j(&s);
    assert_eq!(c, vec![0.0, 1.0, 2.5]);
    assert_eq!(src, EnergySource::Counter);
}

#[test]
fn a_counter_read_every_few_samples_still_gives_the_energy() {
    // The counter is read at 0, 300 and 600 ms only (30 J and 60 J over those spans); power in
    // between shapes how each span is shared, the spans' totals are the counter's.
    let s = vec![
        sample(0, Some(100.0), Some(0)),
        sample(100, Some(100.0), None),
        sample(200, Some(100.0), None),
        sample(300, Some(100.0), Some(30_000)),
        sample(400, Some(300.0), None),
        sample(500, Some(300.0), None),
        sample(600, Some(300.0), Some(90_000)),
    ];
    let (c, src) = cumulative_energy_j(&s);
    assert_eq!(src, EnergySource::Counter);
    assert!(
        (c[3] - 30.0).abs() < 1e-9 && (c[6] - 90.0).abs() < 1e-9,
        "{c:?}"
    );
    assert!((c[1] - 10.0).abs() < 1e-9, "{c:?}");
    // 100→300 W ramps in the first interval of the second span: it gets its power's share.
    assert!(c[4] > 30.0 && c[4] < c[5] && c[5] < 90.0, "{c:?}");
}

#[test]
fn a_wrapped_or_missing_counter_falls_back_to_integrated_power() {
    // The counter resets between the 2nd and 3rd sample: that interval integrates power
    // (100 W and 300 W over 0.1 s: 20 J by the trapezoid); the others use the counter.
    let s = vec![
        sample(0, Some(100.0), Some(1_000)),
        sample(100, Some(100.0), Some(2_000)),
        sample(200, Some(300.0), Some(500)),
        sample(300, Some(300.0), Some(1_500)),
    ];
    let (c, src) = cumulative_energy_j(&s);
    assert!((c[3] - 22.0).abs() < 1e-9, "{c:?}");
    assert_eq!(src, EnergySource::Mixed);
    // No counter at all: power only; one end without power uses the other end's.
    let s = vec![
        sample(0, Some(200.0), None),
        sample(500, None, None),
        sample(1_000, Some(100.0), None),
    ];
    let (c, src) = cumulative_energy_j(&s);
    assert_eq!(src, EnergySource::IntegratedPower);
    assert!((c[2] - 150.0).abs() < 1e-9, "{c:?}");
    // Neither: no energy, and the summary says so rather than reporting 0 J.
    let rec = recording(vec![sample(0, None, None), sample(100, None, None)]);
    let sum = rec.summary(None);
    assert_eq!(sum.energy_source, EnergySource::None);
    assert_eq!(sum.energy_j, None);
    assert_eq!(sum.power_w, None);
}

#[test]
fn energy_in_a_window_interpolates_between_samples() {
    let s = vec![
        sample(0, None, Some(0)),
        sample(1_000, None, Some(10_000)),
        sample(2_000, None, Some(30_000)),
    ];
    let (c, _) = cumulative_energy_j(&s);
    let e = energy_between_j(&s, &c, 500_000_000, 1_500_000_000);
    assert!((e - 15.0).abs() < 1e-9, "{e}"); // 5 J + 10 J
    assert!((energy_between_j(&s, &c, -5, 5_000_000_000) - 30.0).abs() < 1e-9);
}

#[test]
fn summary_maths_over_the_run_window() {
    let mut samples: Vec<Sample> = (0..5)
        .map(|k| Sample {
            t_ns: k * 100_000_000,
            reading: steady(k as u64),
        })
        .collect();
    samples[4].reading.throttle_reasons = Some(0x8 | 0x1);
    let rec = recording(samples);
    // Window 100..300 ms: samples 1, 2, 3.
    let s = rec.summary(Some((100_000_000, 300_000_000)));
    assert_eq!(s.samples, 3);
    let p = s.power_w.unwrap();
    assert_eq!((p.mean, p.min, p.max), (102.0, 101.0, 103.0));
    assert_eq!(s.temperature_c.unwrap().max, 43.0);
    assert_eq!(s.sm_clock_mhz.unwrap().mean, 1980.0);
    assert_eq!(s.throttle_reasons, vec!["sw_power_cap"]);
    assert!((s.energy_j.unwrap() - 2.0).abs() < 1e-9);
    assert!((s.duration_s - 0.2).abs() < 1e-9);
    assert_eq!(s.sm_util_pct, None, "no GPM on the fake: null, not 0");
    let all = rec.summary(None);
    assert_eq!(all.samples, 5);
    assert_eq!(
        all.throttle_reasons,
        vec!["gpu_idle", "sw_power_cap", "hw_slowdown"]
    );
    assert_eq!(throttle_names(0x4 | 0x1000), vec!["sw_power_cap", "other"]);
    // The names summary.json uses are DESIGN.md's.
    let v = serde_json::to_value(&all).unwrap();
    for k in [
        "power_w",
        "energy_j",
        "sm_clock_mhz",
        "mem_clock_mhz",
        "temperature_c",
        "throttle_reasons",
        "memory_used_mib",
        "gpu_util_pct",
        "sm_util_pct",
        "sm_occupancy_pct",
        "tensor_util_pct",
        "dram_bw_util_pct",
        "sampler_cpu_pct",
    ] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
}

#[test]
fn csv_has_the_documented_columns_and_times_since_t0() {
    let mut samples: Vec<Sample> = (0..3)
        .map(|k| Sample {
            t_ns: 1_000_000_000 + k * 50_000_000,
            reading: steady(k as u64),
        })
        .collect();
    samples[1].reading.process_memory_mib = vec![(42, 512.0), (43, 1024.4)];
    samples[1].reading.throttle_reasons = Some(0x4 | 0x20);
    let rec = recording(samples);
    let csv = rec.csv(1_050_000_000);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(lines.len(), 4);
    let cols = CSV_HEADER.split(',').count();
    assert_eq!(cols, 15);
    for l in &lines[1..] {
        assert_eq!(l.split(',').count(), cols, "{l}");
    }
    let row: Vec<&str> = lines[2].split(',').collect();
    assert_eq!(row[0], "0.000");
    assert_eq!(row[1], "101.00");
    assert_eq!(row[2], "1.000", "cumulative energy from the counter");
    assert_eq!(row[6], "sw_power_cap|sw_thermal_slowdown");
    assert_eq!(row[4], "", "no memory clock from this device");
    assert_eq!(row[14], "42:512|43:1024");
    assert!(lines[1].starts_with("-0.050,"));
}

#[test]
fn attach_gives_energy_to_a_workload_that_ran_alone_only() {
    let mut samples: Vec<Sample> = (0..3)
        .map(|k| Sample {
            t_ns: k * 1_000_000_000,
            reading: steady(k as u64),
        })
        .collect();
    samples[1].reading.process_memory_mib = vec![(7, 300.0), (std::process::id(), 900.0)];
    let rec = recording(samples);
    let t = rec.summary(None);
    let mut one = summary(&[("a", 10, 2, None)]);
    attach(&mut one, &rec, &t);
    let w = &one.workloads[0].metrics;
    assert_eq!(w.energy_j, Some(2.0));
    assert_eq!(w.j_per_image, Some(0.1));
    assert_eq!(w.gpu_memory_mib, Some(900.0));
    assert_eq!(one.telemetry.as_ref().map(|t| t.samples), Some(3));
    let mut two = summary(&[("a", 10, 1, Some(7)), ("b", 10, 1, None)]);
    attach(&mut two, &rec, &t);
    assert_eq!(two.workloads[0].metrics.gpu_memory_mib, Some(300.0));
    assert_eq!(two.workloads[0].metrics.energy_j, None);
    assert_eq!(two.workloads[1].metrics.energy_j, None);
    assert_eq!(two.workloads[1].metrics.gpu_memory_mib, None);
}

/// A run's summary with workloads `(name, completed, batch, worker pid)`.
fn summary(workloads: &[(&str, u64, u32, Option<u32>)]) -> isolane_core::results::RunSummary {
    use isolane_core::results::{RunSummary, WorkloadSummary};
    let mut s = RunSummary::new("run");
    for &(name, completed, batch, pid) in workloads {
        let mut w = WorkloadSummary::new(name, "spin:1ms", batch);
        w.metrics.completed = completed;
        w.pid = pid;
        s.workloads.push(w);
    }
    s
}

#[test]
fn without_nvml_opening_is_a_clear_error() {
    // CI and the dev machine have no NVIDIA driver; on the GPU machine this opens GPU 0.
    match nvml::NvmlSource::open(0) {
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(msg.contains("NVML"), "{msg}");
        }
        Ok(mut s) => {
            let r = s.read();
            assert!(r.power_w.is_some(), "a real GPU reports power");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nvml_sampler_on_a_real_gpu_reads_everything_for_under_one_percent_of_a_core() {
    let src = nvml::NvmlSource::open(0).expect("NVML on the GPU machine");
    let s = Sampler::start(Box::new(src), DEFAULT_PERIOD).unwrap();
    // Long enough that the first readings, which measure every query's cost, weigh little.
    std::thread::sleep(Duration::from_secs(6));
    let rec = s.stop().unwrap();
    let sum = rec.summary(None);
    eprintln!("{}", serde_json::to_string_pretty(&sum).unwrap());
    eprintln!(
        "{}",
        rec.csv(rec.samples[0].t_ns)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        rec.samples.len() >= 100,
        "{} samples in 6 s",
        rec.samples.len()
    );
    assert!(
        sum.power_w.is_some() && sum.energy_j.is_some_and(|e| e > 0.0),
        "{sum:?}"
    );
    assert!(
        sum.sm_clock_mhz.is_some() && sum.temperature_c.is_some(),
        "{sum:?}"
    );
    assert!(sum.memory_used_mib.is_some(), "{sum:?}");
    assert!(
        rec.cpu_pct() < 1.0,
        "sampler used {:.3} % of a core",
        rec.cpu_pct()
    );
}

#[test]
fn the_hook_sees_every_reading_the_recording_keeps() {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let hook: crate::SampleHook = Arc::new(move |r: &Reading| log.lock().unwrap().push(r.clone()));
    let s = Sampler::start_observed(fake(Duration::ZERO), Duration::from_millis(5), Some(hook))
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let rec = s.stop().unwrap();
    let seen = seen.lock().unwrap();
    let kept: Vec<Reading> = rec.samples.iter().map(|s| s.reading.clone()).collect();
    assert!(!kept.is_empty());
    assert_eq!(*seen, kept);
}

/// Another fake GPU: twice `steady`'s power, its own device memory.
fn busy(k: u64) -> Reading {
    Reading {
        power_w: Some(300.0),
        energy_counter_mj: Some(3_000 * k),
        ..Reading::default()
    }
}

fn recording_of(gpu: u32, f: fn(u64) -> Reading, times_ms: &[i64]) -> GpuTelemetry {
    let samples: Vec<Sample> = times_ms
        .iter()
        .enumerate()
        .map(|(k, &t)| Sample {
            t_ns: t * 1_000_000,
            reading: f(k as u64),
        })
        .collect();
    let recording = recording(samples);
    let mut summary = recording.summary(None);
    summary.gpu = Some(gpu);
    GpuTelemetry {
        gpu,
        recording,
        summary,
    }
}

#[test]
fn two_gpus_csv_has_a_gpu_column_and_both_gpus_rows_in_time_order() {
    let gpus = [
        recording_of(1, steady, &[0, 100, 200]),
        recording_of(0, busy, &[50, 150]),
    ];
    let csv = run_csv(&gpus, 0);
    let lines: Vec<&str> = csv.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(&header[..3], &["t_s", "gpu", "power_w"]);
    assert_eq!(header.len(), CSV_HEADER.split(',').count() + 1);
    assert_eq!(
        &header[2..],
        &CSV_HEADER.split(',').collect::<Vec<_>>()[1..]
    );
    let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 5);
    let order: Vec<(&str, &str)> = rows.iter().map(|r| (r[0], r[1])).collect();
    assert_eq!(
        order,
        [
            ("0.000", "1"),
            ("0.050", "0"),
            ("0.100", "1"),
            ("0.150", "0"),
            ("0.200", "1")
        ]
    );
    for r in &rows {
        assert_eq!(r.len(), header.len(), "{r:?}");
    }
    // Each GPU's power and its own cumulative energy (since its own first sample).
    assert_eq!((rows[1][2], rows[1][3]), ("300.00", "0.000"));
    assert_eq!((rows[3][2], rows[3][3]), ("300.00", "3.000"));
    assert_eq!((rows[2][2], rows[2][3]), ("101.00", "1.000"));
    // One GPU: exactly the file a single-GPU run always wrote.
    let one = [recording_of(0, steady, &[0, 100])];
    assert_eq!(run_csv(&one, 0), one[0].recording.csv(0));
    assert!(run_csv(&one, 0).starts_with("t_s,power_w,"));
}

#[test]
fn on_two_gpus_each_workload_gets_its_own_gpus_energy_and_memory() {
    let mut g0 = recording_of(0, busy, &[0, 1_000, 2_000]);
    let mut g1 = recording_of(1, steady, &[0, 1_000, 2_000]);
    // pid 7 (workload a) holds 300 MiB on GPU 0; the same pid number on GPU 1 is not a's.
    g0.recording.samples[1].reading.process_memory_mib = vec![(7, 300.0), (8, 100.0)];
    g1.recording.samples[1].reading.process_memory_mib =
        vec![(7, 5_000.0), (std::process::id(), 900.0)];
    let gpus = [g0, g1];
    // a and b share GPU 0; c is alone on GPU 1, on a thread of this process; d is on the CPU.
    let mut s = summary(&[
        ("a", 10, 1, Some(7)),
        ("b", 10, 1, Some(8)),
        ("c", 10, 2, None),
        ("d", 10, 1, None),
    ]);
    let gpu_of = |name: &str| match name {
        "a" | "b" => Some(0),
        "c" => Some(1),
        _ => None,
    };
    attach_gpus(&mut s, &gpus, &gpu_of);
    assert_eq!(s.telemetry, None, "no one object stands for two GPUs");
    let per: Vec<(Option<u32>, Option<f64>)> = s
        .telemetry_per_gpu
        .iter()
        .map(|t| (t.gpu, t.energy_j))
        .collect();
    assert_eq!(per, [(Some(0), Some(6.0)), (Some(1), Some(2.0))]);
    let m = |i: usize| &s.workloads[i].metrics;
    assert_eq!(m(0).gpu_memory_mib, Some(300.0), "a's memory on GPU 0");
    assert_eq!(m(1).gpu_memory_mib, Some(100.0));
    assert_eq!((m(0).energy_j, m(1).energy_j), (None, None), "GPU 0 shared");
    assert_eq!(m(2).energy_j, Some(2.0), "c ran alone on GPU 1");
    assert_eq!(m(2).j_per_image, Some(0.1));
    assert_eq!(m(2).gpu_memory_mib, Some(900.0));
    assert_eq!((m(3).energy_j, m(3).gpu_memory_mib), (None, None));
    // summary.json: each GPU's object names its GPU; `telemetry` is left out.
    let v = serde_json::to_value(&s).unwrap();
    assert!(v.get("telemetry").is_none(), "{v}");
    assert_eq!(v["telemetry_per_gpu"][1]["gpu"], 1);
    let back: isolane_core::results::RunSummary = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
}

#[test]
fn on_one_gpu_attach_gpus_is_attach() {
    let mut g = recording_of(0, steady, &[0, 1_000, 2_000]);
    g.summary.gpu = None;
    let mut a = summary(&[("a", 10, 2, None)]);
    let mut b = a.clone();
    attach_gpus(&mut a, std::slice::from_ref(&g), &|_| Some(0));
    attach(&mut b, &g.recording, &g.summary);
    assert_eq!(a, b);
    assert!(a.telemetry_per_gpu.is_empty());
    let v = serde_json::to_value(&a).unwrap();
    assert!(v["telemetry"].get("gpu").is_none(), "{v}");
    assert!(v.get("telemetry_per_gpu").is_none(), "{v}");
}

#[test]
fn run_telemetry_samples_every_gpu_and_writes_one_csv() {
    let sources: Vec<(u32, Box<dyn Source>)> = vec![
        (1, fake(Duration::ZERO)),
        (
            0,
            Box::new(Fake {
                n: 0,
                burn: Duration::ZERO,
                f: busy,
            }),
        ),
    ];
    let t = RunTelemetry::start_sources(sources, Duration::from_millis(10), None).unwrap();
    std::thread::sleep(Duration::from_millis(40));
    let dir = tempfile::tempdir().unwrap();
    let gpus = t.finish(dir.path(), None, 0.0).unwrap();
    assert_eq!(gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), [1, 0]);
    for g in &gpus {
        // The first reading is taken at once, whatever the machine's load.
        assert!(!g.recording.samples.is_empty());
        assert_eq!(g.summary.gpu, Some(g.gpu));
    }
    let csv = std::fs::read_to_string(dir.path().join("telemetry.csv")).unwrap();
    assert!(csv.starts_with("t_s,gpu,power_w,"), "{csv}");
    let gpu_cells: std::collections::BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').nth(1))
        .collect();
    assert_eq!(gpu_cells.into_iter().collect::<Vec<_>>(), ["0", "1"]);
}
