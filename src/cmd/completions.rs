//! `isolane completions SHELL` and `isolane man`: shell completions and man pages generated from
//! the command line's own definition (clap_complete, clap_mangen), so they never drift from it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use clap_complete::Shell;

use super::user;

#[derive(Args)]
#[command(
    about = "Print shell completions (bash, zsh, fish, elvish, powershell)",
    long_about = "Print the completion script for SHELL on stdout. Install it with, for bash: \
                  `mkdir -p ~/.local/share/bash-completion/completions && isolane completions \
                  bash > ~/.local/share/bash-completion/completions/isolane`; zsh: `mkdir -p \
                  ~/.zfunc && isolane completions zsh > ~/.zfunc/_isolane` (with \
                  `fpath+=~/.zfunc` before `compinit` in ~/.zshrc); fish: `mkdir -p \
                  ~/.config/fish/completions && isolane completions fish > \
                  ~/.config/fish/completions/isolane.fish`. Open a new shell afterwards."
)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Args)]
#[command(
    about = "Write the man pages (isolane(1) and one per command)",
    long_about = "Without --out: print isolane(1) on stdout (`isolane man | man -l -`). With \
                  --out DIR: write isolane.1 and isolane-<command>.1 for every command into DIR \
                  (created if missing), e.g. `isolane man --out ~/.local/share/man/man1`, after \
                  which `man isolane-run` works."
)]
pub struct ManArgs {
    /// Folder to write every page into.
    #[arg(long, short = 'o', value_name = "DIR")]
    out: Option<PathBuf>,
}

pub fn completions(args: CompletionsArgs, mut cli: clap::Command) -> anyhow::Result<u8> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut cli, "isolane", &mut out);
    out.flush().context("writing the completions")?;
    Ok(0)
}

pub fn man(args: ManArgs, cli: clap::Command) -> anyhow::Result<u8> {
    let Some(dir) = args.out else {
        let mut out = std::io::stdout().lock();
        clap_mangen::Man::new(cli)
            .render(&mut out)
            .context("writing the man page")?;
        return Ok(0);
    };
    std::fs::create_dir_all(&dir).map_err(|e| user(format!("--out {}: {e}", dir.display())))?;
    let written = write_pages(&dir, cli)?;
    println!("wrote {written} man pages into {}", dir.display());
    Ok(0)
}

/// isolane.1 and isolane-<command>.1 (nested: isolane-sweep-partition.1) for every visible
/// command. Returns how many pages were written.
fn write_pages(dir: &Path, cli: clap::Command) -> anyhow::Result<usize> {
    clap_mangen::generate_to(cli, dir)
        .with_context(|| format!("writing the man pages into {}", dir.display()))?;
    let pages = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("isolane") && name.ends_with(".1")
        })
        .count();
    Ok(pages)
}
