//! The rules of a command workload (docs/programs.md): a runnable command, environment names,
//! a working directory that exists, duration and timeout, and the mechanisms a program can be
//! confined by (green contexts cannot be imposed on another process).

use super::super::program::{valid_env_name, ProgramSpec, PARTITION_ENV};
use super::super::spans::FieldPath::Workload;
use super::{resolve, Checker};
use crate::spec::limits::{MAX_SECONDS, MIN_SECONDS};
use crate::spec::{DeviceSpec, Mechanism, WorkloadSpec};

impl Checker<'_, '_> {
    pub(super) fn program(
        &mut self,
        i: usize,
        w: &WorkloadSpec,
        p: &ProgramSpec,
        device: Option<&DeviceSpec>,
    ) {
        self.command(i, &p.command);
        let mechanism = device.map(|d| d.mechanism).filter(|_| w.on_gpu());
        self.env_names(i, p, mechanism);
        if let Some(cwd) = &p.cwd {
            self.directory(i, cwd);
        }
        self.duration_and_timeout(i, p);
        self.cpus_once(i, &w.cpu);
        if let (Some(Mechanism::Green), false) =
            (mechanism, self.spans.unread(Workload(i, "backend")))
        {
            self.report(
                Workload(i, "command"),
                true,
                "not allowed with mechanism \"green\": green contexts are made inside one \
                 process and cannot be imposed on another program; run it under mechanism \
                 \"mps\" (partition.thread_pct), \"mig\" or \"timeslice\", or set backend = \
                 \"cpu\""
                    .to_string(),
            );
            return;
        }
        self.backend_and_partition(i, w, device);
    }

    fn command(&mut self, i: usize, command: &[String]) {
        let path = Workload(i, "command");
        if self.spans.unread(path) {
            return;
        }
        match command.first() {
            None => self.report(
                path,
                false,
                "found an empty array; expected the program and its arguments, e.g. \
                 [\"python3\", \"serve.py\"] (at least the program)"
                    .to_string(),
            ),
            Some(program) if program.is_empty() || program.contains('\0') => self.report(
                path,
                false,
                format!("found program {program:?}; expected a program name or path"),
            ),
            Some(_) => {}
        }
    }

    /// Names a process can be given, and none of the variables isolane confines a program's
    /// MPS or MIG partition through.
    fn env_names(&mut self, i: usize, p: &ProgramSpec, mechanism: Option<Mechanism>) {
        let path = Workload(i, "env");
        if self.spans.unread(path) {
            return;
        }
        let confined = matches!(mechanism, Some(Mechanism::Mps | Mechanism::Mig));
        for (name, value) in &p.env {
            if !valid_env_name(name) || value.contains('\0') {
                self.report(
                    path,
                    false,
                    format!(
                        "found variable {name:?}; expected a name without '=' or NUL and a \
                         value without NUL"
                    ),
                );
            } else if confined && PARTITION_ENV.contains(&name.as_str()) {
                self.report(
                    path,
                    false,
                    format!(
                        "found {name}, which isolane sets to confine the program to its \
                         partition; expected none of {} (the partition table says what the \
                         program gets)",
                        PARTITION_ENV.join(", ")
                    ),
                );
            }
        }
    }

    fn directory(&mut self, i: usize, cwd: &str) {
        let path = Workload(i, "cwd");
        if self.spans.unread(path) {
            return;
        }
        let dir = resolve(self.base_dir, cwd);
        if !dir.is_dir() {
            self.report(
                path,
                false,
                format!(
                    "{} is not a directory; expected an existing directory (relative paths are \
                     relative to the scenario file's directory)",
                    dir.display()
                ),
            );
        }
    }

    fn duration_and_timeout(&mut self, i: usize, p: &ProgramSpec) {
        let expected = super::seconds_expected("seconds", 1.0);
        let ok = |c: &mut Self, key, x: Option<f64>| match x {
            Some(x) => c.positive(Workload(i, key), x, MIN_SECONDS, MAX_SECONDS, &expected),
            None => false,
        };
        let duration_ok = ok(self, "duration_s", p.duration_s);
        let timeout_ok = ok(self, "timeout_s", p.timeout_s);
        if let (true, true, Some(d), Some(t)) = (duration_ok, timeout_ok, p.duration_s, p.timeout_s)
        {
            if t <= d {
                self.report(
                    Workload(i, "timeout_s"),
                    false,
                    format!(
                        "found timeout_s = {t} with duration_s = {d}; expected timeout_s > \
                         duration_s (the program is stopped at its duration, a normal end; the \
                         timeout catches one still running later)"
                    ),
                );
            }
        }
    }
}
