//! `sequenced-demo`: the tools of scripts/demo.sh (see the testkit's `demo` module).

fn main() -> std::process::ExitCode {
    sequenced_testkit::demo::main()
}
