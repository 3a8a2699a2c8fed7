//! The `sequenced` binary: everything is in the library.

fn main() -> std::process::ExitCode {
    sequenced::cli::main()
}
