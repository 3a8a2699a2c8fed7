//! Hostile chart archives, and the check that the chart loader survives them within its limits.
//!
//! One generator serves the fuzz target (`fuzz/fuzz_targets/chart_archive.rs`, which includes
//! this file by path) and its stable twin, the property test in `tests/chart_archives.rs`: from
//! a few bytes, [`archive`] makes a packaged chart with nested `.tgz` subcharts (chains of them
//! deeper than the depth limit), directory subcharts nested in the archive, symbolic and hard
//! links, `..`, absolute and drive paths, files at and past the size limits, headers that claim
//! more than they hold, GNU long names and PAX records past the byte budget, more entries than
//! the file limit, and gzip framings (two members, cut short, trailing bytes, no gzip at all).
//! [`check`] loads one within [`SMALL`] limits and asserts what must hold for any input: the
//! loader returns, the heap it used stays within what the limits allow (measured by the
//! [`Counting`] allocator, which the binary installs as its global allocator), and every error
//! names the chart.
//!
//! Only `std`, `flate2`, `tar` and `sequenced` are used, so that the fuzz crate can compile this
//! file without the rest of the test kit.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;

use sequenced::chart::{ChartError, Gathered, Limit, Limits, Location};

/// The limits hostile archives are loaded with: small, so that an archive past them is quick to
/// make and to read (the loader's logic is the same at any size; `tests/chart_archives.rs`
/// checks [`Limits::DEFAULT`] itself with real-sized archives).
pub const SMALL: Limits = Limits {
    bytes: 256 * 1024,
    files: 64,
    depth: 3,
    file_size: 32 * 1024,
};

/// What the top archive is called in messages.
pub const NAME: &str = "hostile.tgz";

/// The heap a load within `limits` may use at its peak: the kept bytes (at most the budget,
/// twice over while a vector grows), a tar long name being read (likewise), a few hundred bytes
/// per file, and the decompressors' buffers.
pub fn heap_allowed(limits: &Limits) -> usize {
    let bytes = usize::try_from(limits.bytes).unwrap_or(usize::MAX);
    let files = usize::try_from(limits.files).unwrap_or(usize::MAX);
    bytes
        .saturating_mul(4)
        .saturating_add(files.saturating_mul(512))
        .saturating_add(2 << 20)
}

/// Loads `archive` within `limits` and panics when anything that must hold does not: the tree
/// is read with at most [`heap_allowed`] bytes of heap, a refusal for a limit names the chart
/// and the limit it was loaded with, every error names the chart, a chart that loads is no
/// deeper than the depth limit, and parsing what was read never panics.
pub fn check(archive: &[u8], limits: &Limits) {
    let (gathered, peak) =
        peak_during(|| sequenced::chart::gather_archive(archive, Location::archive(NAME), limits));
    let allowed = heap_allowed(limits);
    assert!(
        peak <= allowed,
        "reading the archive took {peak} bytes of heap, more than the {allowed} its limits allow"
    );
    let loaded = gathered.and_then(Gathered::build);
    match loaded {
        Ok(chart) => {
            fn depth(chart: &sequenced::chart::Chart) -> usize {
                chart
                    .subcharts
                    .iter()
                    .map(|s| 1 + depth(s))
                    .max()
                    .unwrap_or(0)
            }
            assert!(
                depth(&chart) <= limits.depth,
                "a chart {} levels deep loaded",
                depth(&chart)
            );
        }
        Err(error) => {
            if let ChartError::TooLarge { chart, limit, .. } = &error {
                assert_eq!(chart, NAME, "{error}");
                let expected = match limit {
                    Limit::Bytes(n) => *n == limits.bytes,
                    Limit::Files(n) => *n == limits.files,
                    Limit::Depth(n) => *n == limits.depth,
                    Limit::FileSize(n) => *n == limits.file_size,
                };
                assert!(expected, "{error}: not the limit loaded with");
            }
            let message = error.to_string();
            assert!(
                message.contains(NAME),
                "the error names no chart: {message}"
            );
        }
    }
}

/// A global allocator that counts, per thread, the heap in use while [`peak_during`] measures.
/// A binary that calls [`check`] installs it: `#[global_allocator] static A: Counting = Counting;`
pub struct Counting;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static IN_USE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static SEEN: Cell<bool> = const { Cell::new(false) };
}

fn count(delta: isize) {
    let _ = MEASURING.try_with(|measuring| {
        if measuring.get() {
            SEEN.with(|seen| seen.set(true));
            IN_USE.with(|in_use| {
                let now = in_use.get() + delta;
                in_use.set(now);
                PEAK.with(|peak| peak.set(peak.get().max(now)));
            });
        }
    });
}

// SAFETY: every call is passed to the system allocator as it is; the counting only reads and
// writes thread-local cells, which allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            count(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(pointer, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

/// Runs `work` and returns what it returned and the most heap it had in use at once, on this
/// thread, counted from its start. Panics when [`Counting`] is not the global allocator.
pub fn peak_during<T>(work: impl FnOnce() -> T) -> (T, usize) {
    IN_USE.with(|c| c.set(0));
    PEAK.with(|c| c.set(0));
    SEEN.with(|c| c.set(false));
    MEASURING.with(|c| c.set(true));
    let out = work();
    MEASURING.with(|c| c.set(false));
    assert!(
        SEEN.with(Cell::get),
        "no allocation was counted: install archives::Counting as the #[global_allocator]"
    );
    (out, PEAK.with(Cell::get).max(0) as usize)
}

/// The bytes a recipe is read from; past its end every read is 0, so any input makes an archive
/// (the empty one, a small valid chart).
struct Recipe<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Bytes of entries made so far: the generator stays small whatever the recipe.
    made: usize,
}

impl Recipe<'_> {
    fn byte(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    /// A number below `n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        let wide = u16::from_le_bytes([self.byte(), self.byte()]);
        usize::from(wide) % n
    }

    fn pick<'p, T: ?Sized>(&mut self, choices: &[&'p T]) -> &'p T {
        choices[self.below(choices.len())]
    }
}

/// At most this many bytes of entries per archive made, nested ones included.
const MAKE_AT_MOST: usize = 8 << 20;

/// The packaged chart the recipe `bytes` describes (see the module's documentation).
pub fn archive(bytes: &[u8]) -> Vec<u8> {
    let mut recipe = Recipe {
        bytes,
        at: 0,
        made: 0,
    };
    let tar = chart_tar(&mut recipe, "c", 0);
    frame(&mut recipe, &tar)
}

/// Chart.yaml of a chart named `name`.
fn chart_yaml(name: &str) -> Vec<u8> {
    format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n").into_bytes()
}

/// The tar stream of one chart, `depth` archives down.
fn chart_tar(recipe: &mut Recipe<'_>, name: &str, depth: usize) -> Vec<u8> {
    let mut tar = Tar::default();
    let top = match recipe.below(16) {
        0 => recipe.pick(&["", ".", "..", "/abs", "c:", "Chart.yaml", "a\\b", "c/../.."]),
        _ => name,
    };
    if recipe.below(8) != 0 {
        tar.file(&format!("{top}/Chart.yaml"), &chart_yaml(name));
    }
    let entries = recipe.below(6) + usize::from(depth == 0);
    for _ in 0..entries {
        if recipe.made > MAKE_AT_MOST {
            break;
        }
        entry(recipe, &mut tar, top, depth);
    }
    tar.finish(recipe.below(8) != 0)
}

/// Sizes around the small limits, and past them.
fn size(recipe: &mut Recipe<'_>) -> usize {
    let file = SMALL.file_size as usize;
    let bytes = SMALL.bytes as usize;
    *recipe.pick(&[
        &0,
        &1,
        &100,
        &(file - 1),
        &file,
        &(file + 1),
        &(bytes / 2),
        &bytes,
        &(bytes + 1),
        &(bytes * 8),
    ])
}

/// A path inside a chart, many of them hostile.
fn path(recipe: &mut Recipe<'_>) -> String {
    let name = recipe.pick(&["a", "b", "_hidden", ".dot", "x.tgz", "a-0.1.0.tgz"]);
    match recipe.below(16) {
        0 => format!("charts/{name}"),
        1 => format!("charts/{name}/Chart.yaml"),
        2 => format!("charts/{name}/templates/t.yaml"),
        3 => "templates/t.yaml".to_string(),
        4 => "../escape".to_string(),
        5 => "charts/../../escape".to_string(),
        6 => "/etc/passwd".to_string(),
        7 => "c:/x".to_string(),
        8 => "charts/a\\..\\..\\x".to_string(),
        9 => "Chart.yaml".to_string(),
        10 => "requirements.yaml".to_string(),
        11 => format!("charts/{name}.prov"),
        12 => "charts/a/charts/b/charts/c/charts/d/Chart.yaml".to_string(),
        13 => "./charts/./a/../b.tgz".to_string(),
        14 => "charts//a//Chart.yaml".to_string(),
        _ => format!("values-{}.yaml", recipe.byte()),
    }
}

/// One entry (or a few) of a chart's archive, under its top directory `top`.
fn entry(recipe: &mut Recipe<'_>, tar: &mut Tar, top: &str, depth: usize) {
    let at = |path: &str| format!("{top}/{path}");
    match recipe.below(14) {
        // A file with text from the recipe.
        0 => {
            let length = recipe.below(64);
            let text: Vec<u8> = (0..length).map(|_| recipe.byte()).collect();
            let path = path(recipe);
            tar.file(&at(&path), &text);
        }
        // A file of zeros, at or past a limit.
        1 => {
            let length = size(recipe);
            recipe.made += length;
            let path = path(recipe);
            tar.file(&at(&path), &vec![0; length]);
        }
        // A packaged subchart, made from the recipe too.
        2 if depth < 6 => {
            let name = recipe.pick(&["a", "b", "_c", "sub"]);
            let inner = chart_tar(recipe, name, depth + 1);
            let packed = frame(recipe, &inner);
            recipe.made += packed.len();
            tar.file(&at(&format!("charts/{name}-0.1.0.tgz")), &packed);
        }
        // A chain of packaged subcharts, each inside the one before.
        3 => {
            let levels = recipe.below(8) + 1;
            let packed = chain(levels);
            recipe.made += packed.len();
            tar.file(&at("charts/l1-0.1.0.tgz"), &packed);
        }
        // Subchart directories nested inside this archive.
        4 => {
            let levels = recipe.below(8) + 1;
            let mut dir = String::new();
            for level in 1..=levels {
                dir.push_str(&format!("charts/d{level}/"));
                tar.file(
                    &at(&format!("{dir}Chart.yaml")),
                    &chart_yaml(&format!("d{level}")),
                );
            }
        }
        // A symbolic or hard link.
        5 | 6 => {
            let target = recipe.pick(&[
                "../../../etc/passwd",
                "/etc/passwd",
                "Chart.yaml",
                "charts/a-0.1.0.tgz",
                ".",
            ]);
            let kind = if recipe.below(2) == 0 {
                tar::EntryType::Symlink
            } else {
                tar::EntryType::Link
            };
            let path = path(recipe);
            tar.link(&at(&path), target, kind);
        }
        // A directory entry.
        7 => {
            let path = path(recipe);
            tar.raw(&at(&path), tar::EntryType::Directory, 0, &[]);
        }
        // A header that claims more than the entry holds.
        8 => {
            let claimed = size(recipe) as u64 + 1;
            let path = path(recipe);
            tar.raw(&at(&path), tar::EntryType::Regular, claimed, b"short");
        }
        // A GNU long name, up to past the byte budget.
        9 => {
            let length = size(recipe).max(101);
            recipe.made += length;
            let mut name = at("charts/");
            name.extend(std::iter::repeat_n('n', length));
            tar.file(&name, b"x");
        }
        // A PAX record: a long path, or a size that overrides the header's.
        10 => {
            let record = if recipe.below(2) == 0 {
                let length = size(recipe);
                recipe.made += length;
                pax_record("path", &format!("{top}/charts/{}", "p".repeat(length)))
            } else {
                pax_record("size", &format!("{}", size(recipe) as u64 * 1000))
            };
            tar.raw("pax", tar::EntryType::XHeader, record.len() as u64, &record);
            tar.file(&at("templates/after-pax.yaml"), b"kind: x\n");
        }
        // More files than the file limit.
        11 => {
            let count = recipe.below(2 * SMALL.files as usize);
            for index in 0..count {
                tar.file(&at(&format!("templates/f{index}.yaml")), b"");
            }
        }
        // Entry types a chart never holds.
        12 => {
            let kind = *recipe.pick(&[
                &tar::EntryType::Fifo,
                &tar::EntryType::Char,
                &tar::EntryType::Block,
                &tar::EntryType::GNUSparse,
                &tar::EntryType::Continuous,
                &tar::EntryType::XGlobalHeader,
            ]);
            let length = recipe.below(1024);
            let path = path(recipe);
            tar.raw(&at(&path), kind, length as u64, &vec![1; length]);
        }
        // requirements.yaml naming a subchart.
        _ => tar.file(
            &at("requirements.yaml"),
            b"dependencies:\n- name: a\n  version: 0.1.0\n",
        ),
    }
}

/// `levels` packaged charts, each holding the next in its charts/ (`l1` holds `l2`, ...).
pub fn chain(levels: usize) -> Vec<u8> {
    let mut packed: Option<Vec<u8>> = None;
    for level in (1..=levels).rev() {
        let name = format!("l{level}");
        let mut tar = Tar::default();
        tar.file(&format!("{name}/Chart.yaml"), &chart_yaml(&name));
        if let Some(inner) = packed.take() {
            tar.file(&format!("{name}/charts/l{}-0.1.0.tgz", level + 1), &inner);
        }
        packed = Some(gzip(&tar.finish(true)));
    }
    packed.unwrap_or_default()
}

/// A PAX extended header record: `"<length> <key>=<value>\n"`, the length counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut length = body.len() + 1;
    while format!("{length}{body}").len() != length {
        length += 1;
    }
    format!("{length}{body}").into_bytes()
}

/// How the tar stream is put into a file: one gzip member, two, cut short, trailing bytes, or
/// not compressed at all.
fn frame(recipe: &mut Recipe<'_>, tar: &[u8]) -> Vec<u8> {
    match recipe.below(12) {
        0 => {
            let cut = tar.len() * recipe.below(8) / 8;
            let mut out = gzip(&tar[..cut]);
            out.extend(gzip(&tar[cut..]));
            out
        }
        1 => {
            let out = gzip(tar);
            let keep = out.len() * (recipe.below(7) + 1) / 8;
            out[..keep].to_vec()
        }
        2 => {
            let mut out = gzip(tar);
            out.extend([0x1f, 0x8b, recipe.byte(), recipe.byte()]);
            out
        }
        3 => tar.to_vec(),
        _ => gzip(tar),
    }
}

/// `bytes` gzip-compressed, quickly.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .unwrap_or_default()
}

/// A tar stream written by hand, so that any name and any claimed size can be in it.
#[derive(Default)]
pub struct Tar {
    out: Vec<u8>,
}

impl Tar {
    /// A regular file; a name longer than a header holds gets a GNU long name entry first.
    pub fn file(&mut self, name: &str, data: &[u8]) {
        self.raw(name, tar::EntryType::Regular, data.len() as u64, data);
    }

    /// A link named `name` to `target`.
    pub fn link(&mut self, name: &str, target: &str, kind: tar::EntryType) {
        let mut header = header(name.as_bytes(), kind, 0);
        let target = target.as_bytes();
        let length = target.len().min(100);
        header.as_old_mut().linkname[..length].copy_from_slice(&target[..length]);
        header.set_cksum();
        self.out.extend_from_slice(header.as_bytes());
    }

    /// An entry of `kind` whose header claims `size` bytes and that holds `data`.
    pub fn raw(&mut self, name: &str, kind: tar::EntryType, size: u64, data: &[u8]) {
        if name.len() > 100 {
            let mut long = name.as_bytes().to_vec();
            long.push(0);
            let header = header(
                b"././@LongLink",
                tar::EntryType::GNULongName,
                long.len() as u64,
            );
            self.block(&header, &long);
        }
        let header = header(name.as_bytes(), kind, size);
        self.block(&header, data);
    }

    fn block(&mut self, header: &tar::Header, data: &[u8]) {
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(data);
        let padding = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0, padding));
    }

    /// The stream, with the two zero blocks that end an archive when `end`.
    pub fn finish(mut self, end: bool) -> Vec<u8> {
        if end {
            self.out.extend([0; 1024]);
        }
        self.out
    }
}

/// A GNU header for `name` (cut at 100 bytes), `kind` and `size`, its checksum set.
fn header(name: &[u8], kind: tar::EntryType, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    let length = name.len().min(100);
    header.as_old_mut().name[..length].copy_from_slice(&name[..length]);
    header.set_cksum();
    header
}
