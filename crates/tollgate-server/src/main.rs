//! `tollgate`: Tollgate's command line. Each subcommand lives in its own module under `cli/`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
