//! Fuzzes the chart loader with hostile archives: nested `.tgz` subcharts, chains of them past
//! the depth limit, symbolic and hard links, `..` and absolute paths, files and tar long names
//! past the byte budget, headers that lie about sizes, more files than the file limit, gzip
//! framings. An input whose first byte is even is a recipe for the generator the stable property
//! test uses too (`tests/support/src/archives.rs`); an odd one is an archive as it is. Either is
//! loaded within small limits: nothing panics, the heap stays within what the limits allow, and
//! every refusal names the chart and the limit.
#![no_main]

#[path = "../../tests/support/src/archives.rs"]
mod archives;

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOCATOR: archives::Counting = archives::Counting;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        archives::check(&archives::archive(rest), &archives::SMALL);
    } else {
        archives::check(rest, &archives::SMALL);
    }
});
