//! `rnic-vip`: the verification IP's command line. `rnic-vip coverage merge` adds coverage
//! files of many runs into one; `rnic-vip coverage report` prints the table and the holes;
//! `rnic-vip trace check` checks Perfetto JSON and VCD traces; `rnic-vip replay` replays a
//! recording. See `docs/guides/verification.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use rnic_vip::coverage::Coverage;
use rnic_vip::trace::check_perfetto_json;

#[derive(Parser)]
#[command(name = "rnic-vip", about = "The rnic-emu verification IP's tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Functional coverage files (JSON, schema rnic-vip-coverage/1).
    #[command(subcommand)]
    Coverage(CoverageCommand),
    /// Traces (Chrome/Perfetto JSON).
    #[command(subcommand)]
    Trace(TraceCommand),
    /// Replays a recording (JSON lines) and reports the first event that differs.
    Replay {
        /// The recording.
        recording: PathBuf,
    },
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Checks each file is a trace in the format viewers read (Chrome/Perfetto JSON, or VCD
    /// when it starts with `$`), whose stage slices add up to the model's totals; fails on
    /// the first that is not.
    Check {
        /// Trace files.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
}

#[derive(Subcommand)]
enum CoverageCommand {
    /// Adds the runs and hits of every input into one file.
    Merge {
        /// The merged file to write.
        #[arg(short, long)]
        output: PathBuf,
        /// Coverage files to merge (at least one).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
    /// Prints bins hit per group and lists the holes (bins never hit). Holes are not
    /// failures: the exit status is 0 whenever the files could be read.
    Report {
        /// Coverage files (merged first when several).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
    },
}

fn load(inputs: &[PathBuf]) -> Result<Coverage, String> {
    let mut merged: Option<Coverage> = None;
    for path in inputs {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let coverage = Coverage::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        match merged.as_mut() {
            Some(merged) => merged.merge(&coverage),
            None => merged = Some(coverage),
        }
    }
    merged.ok_or_else(|| "no coverage file given".into())
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Coverage(CoverageCommand::Merge { output, inputs }) => {
            let merged = load(&inputs)?;
            std::fs::write(&output, merged.to_json()).map_err(|e| format!("{}: {e}", output.display()))?;
            let (hit, all) = merged.totals();
            println!(
                "merged {} file(s), {} run(s): {hit} of {all} bins hit -> {}",
                inputs.len(),
                merged.runs,
                output.display()
            );
        }
        Command::Coverage(CoverageCommand::Report { inputs }) => print!("{}", load(&inputs)?.report()),
        Command::Replay { recording } => {
            let text = std::fs::read_to_string(&recording).map_err(|e| format!("{}: {e}", recording.display()))?;
            let events = rnic_vip::replay::replay(&text).map_err(|e| format!("{}: {e}", recording.display()))?;
            println!("{}: {events} events replayed identically", recording.display());
        }
        Command::Trace(TraceCommand::Check { inputs }) => {
            for path in inputs {
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                if text.trim_start().starts_with('$') {
                    let variables = rnic_vip::vcd::check_vcd(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                    println!(
                        "{}: VCD, {variables} variables, stage integrals equal the model's totals",
                        path.display()
                    );
                    continue;
                }
                let events = check_perfetto_json(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                println!(
                    "{}: {events} events, stage slices add up to the model's totals",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rnic-vip: {message}");
            ExitCode::FAILURE
        }
    }
}
