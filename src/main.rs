//! The `inferno` binary: parses the command line and runs the chosen subcommand.

fn main() -> std::process::ExitCode {
    inferno::cli::main()
}
