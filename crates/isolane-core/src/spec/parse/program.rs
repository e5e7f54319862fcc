//! The walk of a command workload (`command = [...]`, docs/programs.md): its own keys, and a
//! clear refusal of every key that belongs to a model workload.

use std::collections::BTreeMap;

use toml::de::DeValue;

use super::super::format::seconds_expected;
use super::super::program::{ProgramSpec, MODEL_ONLY_KEYS, PROGRAM_ONLY_KEYS};
use super::super::spans::FieldPath::Workload;
use super::{placeholder_workload, Tbl, Walk};
use crate::spec::{DeviceSpec, Host, MaxRate, Rate, RunLength, WorkloadSpec};

const COMMAND_EXPECTED: &str =
    "an array of strings: the program and its arguments, e.g. [\"python3\", \"serve.py\"]";
const ENV_EXPECTED: &str = "a table of strings, e.g. env = { CUDA_LAUNCH_BLOCKING = \"1\" }";

impl<'a> Walk<'a> {
    pub(super) fn program_workload(
        &mut self,
        i: usize,
        t: &Tbl<'a>,
        device: &DeviceSpec,
    ) -> WorkloadSpec {
        let name = self.required(
            t,
            "name",
            "a name of letters, digits, '_', '.' or '-', unique in the scenario",
            |w, v, p| w.string(v, p, super::NAME_EXPECTED),
        );
        self.refuse_model_keys(i, t);
        let command = self.command(i, t);
        let env = self.env(i, t);
        let cwd = self.optional(t, "cwd", String::new(), |w, v, p| {
            w.string(v, p, "a directory (relative to the scenario file's)")
                .map(str::to_string)
        });
        let seconds = seconds_expected("seconds", 1.0);
        let duration_s = self.optional(t, "duration_s", 1.0, |w, v, p| w.float(v, p, &seconds));
        let timeout_s = self.optional(t, "timeout_s", 1.0, |w, v, p| w.float(v, p, &seconds));
        let cpu = self.cpu_list(i, t);
        let backend = self.workload_backend(t, device);
        let partition = self.partition(i, t);
        let serve = self.serve(i, t, None, true);
        WorkloadSpec {
            name: name.unwrap_or_default().to_string(),
            rate: Rate::Max(MaxRate::Max),
            length: RunLength::Jobs(0),
            warmup_jobs: 0,
            cpu,
            host: Host::Process,
            partition,
            backend,
            serve,
            program: Some(ProgramSpec {
                command,
                env,
                cwd,
                duration_s,
                timeout_s,
            }),
            ..placeholder_workload()
        }
    }

    /// A model workload's keys have no meaning for a program: each one written is refused.
    fn refuse_model_keys(&mut self, i: usize, t: &Tbl<'a>) {
        for &key in MODEL_ONLY_KEYS {
            if self.get(t, key).is_some() {
                let path = Workload(i, key);
                self.spans.mark_unread(path);
                self.report_key(
                    path,
                    "not allowed with `command`: a program workload has no model, rate, \
                     deadline, jobs or warm-up and always runs as its own process; allowed \
                     with command: name, command, env, cwd, duration_s, timeout_s, cpu, \
                     backend, partition",
                );
            }
        }
    }

    /// `env`, `cwd` and `timeout_s` belong to a command workload.
    pub(super) fn refuse_program_keys(&mut self, i: usize, t: &Tbl<'a>) {
        for &key in PROGRAM_ONLY_KEYS.iter().filter(|k| **k != "command") {
            if self.get(t, key).is_some() {
                let path = Workload(i, key);
                self.spans.mark_unread(path);
                self.report_key(
                    path,
                    "only for a command workload (command = [\"prog\", \"arg\", …]); a model \
                     workload's length is duration_s or jobs",
                );
            }
        }
    }

    fn command(&mut self, i: usize, t: &Tbl<'a>) -> Vec<String> {
        let Some(v) = self.get(t, "command") else {
            return Vec::new();
        };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, Workload(i, "command"), COMMAND_EXPECTED);
            return Vec::new();
        };
        let mut out = Vec::with_capacity(items.len());
        for (j, item) in items.iter().enumerate() {
            match item.get_ref() {
                DeValue::String(s) => out.push(s.to_string()),
                other => {
                    self.spans.mark_unread(Workload(i, "command"));
                    self.report(
                        item.span(),
                        format!("workload[{i}].command[{j}]"),
                        format!(
                            "found {}; expected a string (each argument is one string)",
                            super::describe(other)
                        ),
                    );
                }
            }
        }
        out
    }

    fn env(&mut self, i: usize, t: &Tbl<'a>) -> BTreeMap<String, String> {
        let Some(v) = self.get(t, "env") else {
            return BTreeMap::new();
        };
        let DeValue::Table(table) = v.get_ref() else {
            self.wrong(v, Workload(i, "env"), ENV_EXPECTED);
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        for (k, item) in table.iter() {
            let key: &str = k.get_ref().as_ref();
            match item.get_ref() {
                DeValue::String(s) => {
                    out.insert(key.to_string(), s.to_string());
                }
                other => {
                    self.spans.mark_unread(Workload(i, "env"));
                    self.report(
                        item.span(),
                        format!("workload[{i}].env.{key}"),
                        format!(
                            "found {}; expected a string (environment values are text: \
                             write \"1\", not 1)",
                            super::describe(other)
                        ),
                    );
                }
            }
        }
        out
    }
}
