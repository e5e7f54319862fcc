//! A plan that fails its check at a convolution is built again without the path it took there.
//!
//! Why: as an MPS client with 18 % of the H200's threads, mobilenet_v2's fp16 build kept for
//! `features.15.conv.2` the cuDNN algorithm cuDNN's own search timed fastest, and it computed
//! something else there (rel L2 0.57; session 30, in one build of three: cuDNN's search is
//! timed, so its first choice changes from build to build). cuBLASLt's candidates are each
//! checked against the CPU before they are timed (`mm_check`); a convolution's paths are not,
//! so the plan check finds a wrong one after the build, and names its node. The build then
//! bars the path that node's convolution took, at that step, and builds again: cuDNN's next
//! algorithm, a graph-API engine or the im2col + GEMM path is kept there instead (a build that
//! times nothing, as an MPS client's, takes the next one cuDNN offers). Up to
//! [`MAX_REBUILDS`] times; a plan still wrong after them is refused as before, its error
//! naming the paths barred.

use std::ops::Range;

use isolane_engine::{EngineError, Result};

use crate::check::{CheckFailure, CheckReport};

/// Builds after the first, each barring the path(s) the last check found wrong.
pub(crate) const MAX_REBUILDS: usize = 3;

/// A convolution path kept at a plan step (its name as the search log writes it: `cudnn algo
/// …`, `cudnn engine …`, `gemm`), or barred there and at every convolution of its `shape` (the
/// convolution's shapes, strides, pads, dilations and groups, as the build's cache keys them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StepPath {
    pub step: usize,
    pub path: String,
    pub shape: String,
}

/// Builds with `build` (given the paths barred so far) and checks with `check` until the check
/// passes. Where it fails at a node whose steps took a convolution path (`kept`: the paths the
/// model kept in those steps) not yet barred, those paths are barred and the model built again;
/// `note` is told each time. The error of the last check otherwise, naming what was barred.
pub(crate) fn build_checked<M>(
    mut build: impl FnMut(&[StepPath]) -> Result<M>,
    mut check: impl FnMut(&mut M) -> std::result::Result<CheckReport, CheckFailure>,
    kept: impl Fn(&M, Range<usize>) -> Vec<StepPath>,
    note: &mut dyn FnMut(String),
) -> Result<(M, CheckReport)> {
    let mut barred: Vec<StepPath> = Vec::new();
    let mut rebuilds = 0;
    let mut last: Option<EngineError> = None;
    loop {
        let mut m = match (build(&barred), last.take()) {
            (Ok(m), _) => m,
            (Err(e), None) => return Err(e),
            // A rebuild that fails (another path may need memory or a library call the first
            // did not): the check's error stands, the rebuild's said after it.
            (Err(e), Some(check)) => {
                return Err(with_barred(check, &barred, Some(&e)));
            }
        };
        let failure = match check(&mut m) {
            Ok(report) => return Ok((m, report)),
            Err(f) => f,
        };
        let fresh: Vec<StepPath> = failure
            .steps
            .clone()
            .map(|steps| kept(&m, steps))
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !barred.contains(p))
            .collect();
        // The wrong model's memory goes before the next build asks for its own.
        drop(m);
        if fresh.is_empty() || rebuilds == MAX_REBUILDS {
            return Err(with_barred(failure.error, &barred, None));
        }
        note(format!(
            "plan check: {}; building again without {}",
            first_line(&failure.error),
            describe(&fresh)
        ));
        barred.extend(fresh);
        last = Some(failure.error);
        rebuilds += 1;
    }
}

/// The check's error, naming the paths barred before it (none: unchanged) and, where the
/// build without them failed, why.
fn with_barred(e: EngineError, barred: &[StepPath], rebuild: Option<&EngineError>) -> EngineError {
    match (e, rebuild) {
        (EngineError::Runtime(msg), Some(r)) => EngineError::Runtime(format!(
            "{msg} (building again without {} failed: {r})",
            describe(barred)
        )),
        (EngineError::Runtime(msg), None) if !barred.is_empty() => EngineError::Runtime(format!(
            "{msg} (built again without {}, and still wrong)",
            describe(barred)
        )),
        (e, _) => e,
    }
}

fn describe(paths: &[StepPath]) -> String {
    paths
        .iter()
        .map(|p| format!("{} at step {}", p.path, p.step))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The error's message up to the node it names (the rest says what to do when nothing helps).
fn first_line(e: &EngineError) -> String {
    let s = e.to_string();
    match s.find(". The plan was not run") {
        Some(end) => s[..end].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> CheckReport {
        CheckReport {
            rel_l2: 1e-3,
            tolerance: 3e-2,
            sensitivity: None,
            quantization: None,
            ms: 1.0,
        }
    }

    fn wrong_at(steps: Option<Range<usize>>) -> CheckFailure {
        CheckFailure {
            error: EngineError::Runtime(
                "plan check failed: … the first node whose output diverges is `c` (Conv): rel L2 \
                 5.7e-1. The plan was not run; please report this with the model"
                    .into(),
            ),
            steps,
        }
    }

    /// A fake model: the path each of its steps kept.
    struct Model(Vec<StepPath>);

    fn kept(m: &Model, steps: Range<usize>) -> Vec<StepPath> {
        m.0.iter()
            .filter(|p| steps.contains(&p.step))
            .cloned()
            .collect()
    }

    /// Step 3 keeps cuDNN's first algorithm unless it is barred there, then its second; the
    /// first computes a wrong result at step 3.
    fn build(barred: &[StepPath]) -> Result<Model> {
        let first = StepPath {
            step: 3,
            path: "cudnn algo 1".into(),
            shape: String::new(),
        };
        let at3 = if barred.contains(&first) {
            "cudnn algo 6"
        } else {
            "cudnn algo 1"
        };
        Ok(Model(vec![
            StepPath {
                step: 1,
                path: "gemm".into(),
                shape: String::new(),
            },
            StepPath {
                step: 3,
                path: at3.into(),
                shape: String::new(),
            },
        ]))
    }

    #[test]
    fn a_wrong_convolution_path_is_barred_at_its_step_and_the_model_built_again() {
        let mut builds = Vec::new();
        let mut notes = Vec::new();
        let (m, r) = build_checked(
            |barred| {
                builds.push(barred.to_vec());
                build(barred)
            },
            |m: &mut Model| {
                if m.0[1].path == "cudnn algo 1" {
                    Err(wrong_at(Some(2..4)))
                } else {
                    Ok(report())
                }
            },
            kept,
            &mut |n| notes.push(n),
        )
        .unwrap();
        assert_eq!(m.0[1].path, "cudnn algo 6");
        assert_eq!(r.rel_l2, 1e-3);
        // Only the diverging node's steps are barred (not step 1's path), once.
        assert_eq!(builds.len(), 2);
        assert!(builds[0].is_empty());
        assert_eq!(
            builds[1],
            vec![StepPath {
                step: 3,
                path: "cudnn algo 1".into(),
                shape: String::new(),
            }]
        );
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("diverges is `c` (Conv)")
                && notes[0].contains("without cudnn algo 1 at step 3")
                && !notes[0].contains("The plan was not run"),
            "{}",
            notes[0]
        );
    }

    /// The error of a build loop whose every check fails at `steps`, and how many builds it made.
    fn always_wrong_at(steps: Option<Range<usize>>) -> (String, usize) {
        let mut builds = 0;
        let e = build_checked(
            |b| {
                builds += 1;
                build(b)
            },
            |_: &mut Model| Err(wrong_at(steps.clone())),
            kept,
            &mut |_| {},
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        (e, builds)
    }

    #[test]
    fn a_failure_with_no_node_or_no_new_path_is_the_checks_own_error() {
        // No node found: the check's error, unchanged, after one build.
        let (e, builds) = always_wrong_at(None);
        assert_eq!(builds, 1);
        assert!(
            e.contains("diverges is `c`") && !e.contains("built again"),
            "{e}"
        );
        // A node whose steps kept no convolution path (a kernel of our own): the same.
        let (e, builds) = always_wrong_at(Some(4..6));
        assert_eq!(builds, 1);
        assert!(!e.contains("built again"), "{e}");
        // Wrong whatever is barred: stops when nothing new is left to bar, naming what was.
        let (e, builds) = always_wrong_at(Some(3..4));
        assert_eq!(builds, 3);
        assert!(
            e.contains("built again without cudnn algo 1 at step 3, cudnn algo 6 at step 3"),
            "{e}"
        );
    }

    #[test]
    fn a_rebuild_that_fails_keeps_the_checks_error_and_says_why() {
        let mut builds = 0;
        let e = build_checked(
            |barred| {
                builds += 1;
                if barred.is_empty() {
                    build(barred)
                } else {
                    Err(EngineError::InvalidArgument("cudnn workspace".into()))
                }
            },
            |_: &mut Model| Err(wrong_at(Some(3..4))),
            kept,
            &mut |_| {},
        )
        .map(|_| ())
        .unwrap_err();
        assert_eq!(builds, 2);
        let msg = e.to_string();
        assert!(matches!(e, EngineError::Runtime(_)), "{e:?}");
        assert!(
            msg.contains("diverges is `c`")
                && msg.contains("building again without cudnn algo 1 at step 3 failed")
                && msg.contains("cudnn workspace"),
            "{msg}"
        );
    }

    #[test]
    fn rebuilds_stop_at_the_limit() {
        // Every build keeps a new path at the failing step.
        let mut builds = 0;
        let e = build_checked(
            |barred| {
                builds += 1;
                Ok(Model(vec![StepPath {
                    step: 0,
                    path: format!("cudnn engine {}", barred.len()),
                    shape: String::new(),
                }]))
            },
            |_: &mut Model| Err(wrong_at(Some(0..1))),
            kept,
            &mut |_| {},
        )
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert_eq!(builds, MAX_REBUILDS + 1);
        assert!(e.contains("still wrong"), "{e}");
    }
}
