use super::*;
use crate::spec::Mechanism;

const MODELS: &str = include_str!("h200-models.csv");
const POINTS: &str = include_str!("h200-points.csv");

/// The engine's profiles of the committed models (`h200-models.csv`, checked against the
/// engine by its `traffic` tests).
fn models() -> Vec<(String, MemoryProfile)> {
    let mut lines = MODELS.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |name: &str| f[col(name)].parse::<f64>().unwrap();
            (
                f[col("model")].to_string(),
                MemoryProfile {
                    dram_bytes_per_job: num("dram_bytes"),
                    resident: f[col("resident")] == "true",
                    l2_footprint_bytes: num("l2_footprint_bytes"),
                    flops_per_job: num("gflops") * 1e9,
                    source: ProfileSource::Computed,
                },
            )
        })
        .collect()
}

/// One measured point: its row, terms and measured stretch.
struct Point {
    label: String,
    terms: Terms,
    measured: f64,
}

fn points() -> Vec<Point> {
    let models = models();
    let profile = |m: &str| models.iter().find(|(n, _)| n == m).unwrap().1;
    let sys = memory_system("h200").unwrap();
    let mut lines = POINTS.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let victim_exec: f64 = f[col("victim_exec_ms")].parse().unwrap();
            let neighbours: Vec<Neighbour> = f[col("neighbours")]
                .split(';')
                .map(|n| {
                    let (model, exec) = n.split_once(':').unwrap();
                    Neighbour {
                        name: model.to_string(),
                        profile: profile(model),
                        exec_ms: exec.parse().unwrap(),
                    }
                })
                .collect();
            Point {
                label: format!(
                    "{} {} load {} {} beside {}",
                    f[col("mechanism")],
                    f[col("variant")],
                    f[col("load")],
                    f[col("victim")],
                    neighbours
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(" + ")
                ),
                terms: Terms::beside(&neighbours, victim_exec, &sys),
                measured: f[col("stretch_p99")].parse().unwrap(),
            }
        })
        .collect()
}

/// The committed H200 coefficients are the fit of the committed points, and the model
/// predicts each within the error the docs state. Prints the table of
/// docs/interference.md ("Predicting the stretch") with `-- --nocapture`.
#[test]
fn the_h200_coefficients_are_the_fit_of_the_committed_points() {
    let pts = points();
    assert_eq!(pts.len(), 28);
    let data: Vec<(Terms, f64)> = pts.iter().map(|p| (p.terms, p.measured)).collect();
    let c = fit(&data);
    println!("fitted: dram {:.4}, l2 {:.4}", c.dram, c.l2);
    let committed = fitted("h200", Mechanism::Green).unwrap().coefficients;
    assert!(
        (c.dram - committed.dram).abs() < 5e-4 && (c.l2 - committed.l2).abs() < 5e-4,
        "committed {committed:?}, fitted {c:?}"
    );
    println!("| point | DRAM share | L2 share | measured ×p99 | predicted | error |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut worst: f64 = 0.0;
    let mut sum = 0.0;
    for p in &pts {
        let predicted = committed.stretch(&p.terms);
        let err = predicted / p.measured - 1.0;
        worst = worst.max(err.abs());
        sum += err.abs();
        println!(
            "| {} | {:.3} | {:.2} | {:.2} | {:.2} | {:+.1} % |",
            p.label,
            p.terms.dram,
            p.terms.l2,
            p.measured,
            predicted,
            100.0 * err
        );
    }
    println!(
        "mean |error| {:.1} %, worst {:.1} %",
        100.0 * sum / pts.len() as f64,
        100.0 * worst
    );
    assert!(worst < 0.10, "worst error {worst}");

    // Held out: each of the four pairings (a victim beside the other victim, or beside both
    // neighbours) predicted from coefficients fitted to the other three alone.
    let group = |p: &Point| {
        p.label
            .split_once(" load ")
            .unwrap()
            .1
            .split_once(' ')
            .unwrap()
            .1
            .to_string()
    };
    let mut groups: Vec<String> = pts.iter().map(group).collect();
    groups.sort();
    groups.dedup();
    let mut worst_held: f64 = 0.0;
    for g in &groups {
        let rest: Vec<(Terms, f64)> = pts
            .iter()
            .filter(|p| &group(p) != g)
            .map(|p| (p.terms, p.measured))
            .collect();
        let c = fit(&rest);
        let errs: Vec<f64> = pts
            .iter()
            .filter(|p| &group(p) == g)
            .map(|p| c.stretch(&p.terms) / p.measured - 1.0)
            .collect();
        let mean = errs.iter().map(|e| e.abs()).sum::<f64>() / errs.len() as f64;
        worst_held = errs.iter().fold(worst_held, |w, e| w.max(e.abs()));
        println!(
            "held out {g}: fitted dram {:.3}, l2 {:.3} on the rest; mean |error| {:.1} %",
            c.dram,
            c.l2,
            100.0 * mean
        );
    }
    println!("held out, worst {:.1} %", 100.0 * worst_held);
}

#[test]
fn terms_by_hand() {
    let sys = MemorySystem {
        dram_bytes_per_s: 1e12,
        l2_bytes: 50_000_000,
    };
    let streaming = Neighbour {
        name: "big".into(),
        profile: MemoryProfile {
            dram_bytes_per_job: 500e6,
            resident: false,
            l2_footprint_bytes: 500e6,
            flops_per_job: 0.0,
            source: ProfileSource::Computed,
        },
        exec_ms: 1.0,
    };
    // 500 MB in 1 ms = 500 GB/s, half the peak; in a victim job of 0.05 ms it pushes 25 MB
    // through the L2, half of it.
    let t = Terms::of(&streaming, 0.05, &sys);
    assert!(
        (t.dram - 0.5).abs() < 1e-12 && (t.l2 - 0.5).abs() < 1e-12,
        "{t:?}"
    );
    // Beside a longer victim job it takes the whole L2, never more.
    assert_eq!(Terms::of(&streaming, 1.0, &sys).l2, 1.0);
    let resident = Neighbour {
        name: "small".into(),
        profile: MemoryProfile {
            dram_bytes_per_job: 0.0,
            resident: true,
            l2_footprint_bytes: 30e6,
            flops_per_job: 0.0,
            source: ProfileSource::Computed,
        },
        exec_ms: 0.3,
    };
    let r = Terms::of(&resident, 1.0, &sys);
    assert_eq!((r.dram, r.l2), (0.0, 0.6));
    // Together: DRAM shares add, the L2 is at most taken once.
    let both = Terms::beside(&[streaming.clone(), resident.clone()], 0.05, &sys);
    assert!(
        (both.dram - 0.5).abs() < 1e-12 && both.l2 == 1.0,
        "{both:?}"
    );
    let c = Coefficients { dram: 0.4, l2: 0.2 };
    let p = predict(&c, &sys, 0.05, &[streaming, resident]);
    assert!((p.stretch - 1.4).abs() < 1e-12, "{p:?}");
    // streaming alone: 1 + 0.2 + 0.1; resident alone: 1 + 0.12.
    let (name, s) = p.worst.unwrap();
    assert_eq!(name, "big");
    assert!((s - 1.3).abs() < 1e-12);
}

#[test]
fn a_measured_dram_figure_replaces_the_computed_one() {
    let sys = memory_system("h200").unwrap();
    let computed = models()
        .into_iter()
        .find(|(m, _)| m == "vit_l_32")
        .unwrap()
        .1;
    // GPM read 10 % of 4.8 TB/s with 936 jobs/s: 513 MB a job.
    let m = computed.measured(10.0, 936.0, &sys);
    assert_eq!(m.source, ProfileSource::Measured);
    assert!((m.dram_bytes_per_job - 0.1 * 4.8e12 / 936.0).abs() < 1.0);
    assert_eq!(m.l2_footprint_bytes, computed.l2_footprint_bytes);
    // No measurement: the computed profile stays.
    assert_eq!(computed.measured(f64::NAN, 936.0, &sys), computed);
    assert_eq!(computed.measured(10.0, 0.0, &sys), computed);
    // 613 MB in 1.076 ms: 570 GB/s while a job runs.
    assert!((computed.dram_gb_per_s(1.076) - 569.8).abs() < 1.0);
}

#[test]
fn the_fit_recovers_known_coefficients_and_is_never_negative() {
    let truth = Coefficients {
        dram: 1.5,
        l2: 0.25,
    };
    let pts: Vec<(Terms, f64)> = [(0.1, 0.2), (0.3, 1.0), (0.05, 0.9), (0.2, 0.0)]
        .iter()
        .map(|&(d, l)| {
            let t = Terms { dram: d, l2: l };
            (t, truth.stretch(&t))
        })
        .collect();
    let c = fit(&pts);
    assert!(
        (c.dram - 1.5).abs() < 1e-9 && (c.l2 - 0.25).abs() < 1e-9,
        "{c:?}"
    );
    // Points that would want a negative DRAM coefficient get the L2 term alone.
    let pts = vec![
        (Terms { dram: 0.5, l2: 0.1 }, 1.0),
        (Terms { dram: 0.0, l2: 1.0 }, 1.3),
    ];
    let c = fit(&pts);
    assert_eq!(c.dram, 0.0);
    assert!(c.l2 > 0.0);
    assert_eq!(fit(&[]), Coefficients { dram: 0.0, l2: 0.0 });
}

#[test]
fn no_coefficients_where_nothing_was_measured() {
    assert!(fitted("h200", Mechanism::Mps).is_some());
    assert!(fitted("h200", Mechanism::Timeslice).is_none());
    assert!(fitted("h200", Mechanism::Mig).is_none());
    assert!(fitted("a100-80gb", Mechanism::Green).is_none());
    assert!(memory_system("orin-nano").is_none());
}

/// Admission's floor for a resident victim is the highest p99 stretch the committed H200
/// matrix measured for a resident victim beside a resident neighbour, a region where the
/// model under-predicts every pair (its only term there is the neighbour's footprint); and
/// each resident victim suffered no less beside any streaming neighbour than beside the
/// resident ones, so the floor holds beside those too.
#[test]
fn the_resident_floor_is_the_matrix_highest_resident_pair() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../results/h200-predict/interference.csv"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let num = |r: &Vec<&str>, name: &str| r[col(name)].parse::<f64>().unwrap();
    // Batch 1 comes first in the models file (resnet50 has a batch-64 row too).
    let models = models();
    let profile = |m: &str| models.iter().find(|(n, _)| n == m).unwrap().1;
    let neighbour_ms = |m: &str| {
        let r = (rows.iter())
            .find(|r| r[col("kind")] == "neighbour" && r[col("neighbour")] == m)
            .unwrap();
        1000.0 / num(r, "neighbour_jobs_per_s")
    };
    let f = fitted("h200", Mechanism::Green).unwrap();
    assert_eq!(f.matrix, "results/h200-predict/interference.csv");
    let sys = memory_system("h200").unwrap();
    let pairs: Vec<(&str, &str, f64, f64)> = (rows.iter())
        .filter(|r| r[col("kind")] == "pair" && r[col("precision")] == "fp16")
        .map(|r| {
            let (v, n) = (r[col("victim")], r[col("neighbour")]);
            let beside = [Neighbour {
                name: n.to_string(),
                profile: profile(n),
                exec_ms: neighbour_ms(n),
            }];
            let p = predict(&f.coefficients, &sys, num(r, "alone_p99_ms"), &beside);
            (v, n, num(r, "stretch_p99"), p.stretch)
        })
        .collect();
    let resident = |m: &str| profile(m).resident;
    let both: Vec<_> = (pairs.iter())
        .filter(|(v, n, ..)| resident(v) && resident(n))
        .collect();
    assert_eq!(both.len(), 6, "{both:?}");
    for (v, n, measured, predicted) in &both {
        println!("{v} beside {n}: measured {measured:.4}, predicted {predicted:.4}");
        assert!(predicted < measured, "{v} beside {n}");
    }
    let highest = both.iter().map(|p| p.2).fold(f64::MIN, f64::max);
    let floor = f.resident_floor.unwrap();
    assert!((floor - highest).abs() < 5e-5, "{floor} vs {highest}");
    for (v, ..) in &both {
        let beside = |res: bool| {
            (pairs.iter())
                .filter(move |(pv, pn, ..)| pv == v && resident(pn) == res)
                .map(|p| p.2)
        };
        let (most_resident, least_streaming) = (
            beside(true).fold(f64::MIN, f64::max),
            beside(false).fold(f64::MAX, f64::min),
        );
        assert!(least_streaming >= most_resident, "{v}");
    }
    // The floor is admission's only: a streaming victim, or one without neighbours, keeps the
    // model's figure.
    let (cnn, vit) = (profile("mobilenet_v2"), profile("vit_b_16"));
    let one = [Neighbour {
        name: "resnet18".into(),
        profile: profile("resnet18"),
        exec_ms: 0.3,
    }];
    assert_eq!(f.admission_stretch(&cnn, &one, 1.1), floor);
    assert_eq!(f.admission_stretch(&cnn, &one, 1.5), 1.5);
    assert_eq!(f.admission_stretch(&vit, &one, 1.1), 1.1);
    assert_eq!(f.admission_stretch(&cnn, &[], 1.0), 1.0);
}
