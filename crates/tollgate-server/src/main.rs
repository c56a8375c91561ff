//! `tollgate`: Tollgate's command line. Each subcommand lives in its own module under `cli/`.

mod cli;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
