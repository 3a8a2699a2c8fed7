//! Reading the Chart.yaml files of a chart directory or packaged chart and its subcharts,
//! following Helm's loader: `.helmignore` for directories, the archive rules (one top directory,
//! no paths outside it), subcharts as directories or `.tgz` files in `charts/`, names starting
//! with `_` or `.` skipped, `.prov` files ignored.
//!
//! Loading has two steps. [`gather`] reads the tree's files, every archive nested in it
//! included, under one budget for the whole tree ([`Limits`]: bytes decompressed, files, the
//! depth of subcharts, one file's size); a chart past a limit is refused with
//! [`ChartError::TooLarge`] before anything of it is parsed, and before helm sees it (Helm's own
//! loader gives each nested archive a fresh 100 MiB). [`Gathered::build`] then parses the
//! Chart.yaml files. The pipeline renders with helm between the two, so that helm's message for
//! a chart both refuse (a missing dependency, a Chart.yaml that is not YAML) is the one users read.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use super::helmignore::Rules;
use super::metadata::{parse_metadata, parse_requirements};
use super::{Chart, ChartError, ChartFile, Location, Metadata, io_message};

/// How much of a chart tree the loader reads before it refuses the chart. One budget serves the
/// whole tree: a packaged subchart inside a packaged chart draws on the same bytes and files as
/// its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes decompressed (and, for a chart directory, read from disk) for the whole tree: every
    /// byte gzip gives of every archive, tar headers included, and every byte of file contents.
    pub bytes: u64,
    /// Files of the whole tree: every entry of every archive (directories and links included)
    /// and every file read from a chart directory.
    pub files: u64,
    /// Levels of subcharts below the top chart (`charts/a/charts/b` is 2), directories and
    /// packaged charts alike.
    pub depth: usize,
    /// One file's size, packaged subcharts included (Helm's `MaxDecompressedFileSize`).
    pub file_size: u64,
}

impl Limits {
    /// The limits the CLI and the operator load with. `bytes` is Helm's own limit for one
    /// archive (`MaxDecompressedChartSize`, 100 MiB), here for the whole tree; `file_size` is
    /// Helm's limit for one file (5 MiB); Helm has no limit of files or depth, and no chart
    /// comes near 10,000 files or 10 levels of subcharts.
    pub const DEFAULT: Limits = Limits {
        bytes: 100 * 1024 * 1024,
        files: 10_000,
        depth: 10,
        file_size: 5 * 1024 * 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The limit a chart tree went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// [`Limits::bytes`].
    Bytes(u64),
    /// [`Limits::files`].
    Files(u64),
    /// [`Limits::depth`].
    Depth(usize),
    /// [`Limits::file_size`].
    FileSize(u64),
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Bytes(n) => write!(
                f,
                "the chart decompresses to more than {n} bytes, the limit for a whole chart \
                 tree with every archive nested in it"
            ),
            Limit::Files(n) => write!(
                f,
                "the chart holds more than {n} files, the limit for a whole chart tree with \
                 every archive nested in it"
            ),
            Limit::Depth(n) => write!(
                f,
                "subcharts are nested more than {n} levels deep, the limit for a chart tree"
            ),
            Limit::FileSize(n) => write!(
                f,
                "the file is larger than {n} bytes, Helm's limit for one file of a chart"
            ),
        }
    }
}

/// What is left of the limits while a tree is read. Shared, not copied, by every archive of
/// the tree; cells, so that the reader under the tar parser can draw on it too.
struct Budget {
    limits: Limits,
    /// Bytes left to decompress or read.
    bytes: Cell<u64>,
    /// Bytes of file contents left (a sparse entry gives more than its archive holds).
    contents: Cell<u64>,
    files: Cell<u64>,
    /// Set when the byte budget stopped a read, whatever error the parser made of it.
    spent: Cell<bool>,
}

impl Budget {
    fn new(limits: &Limits) -> Self {
        Budget {
            limits: *limits,
            bytes: Cell::new(limits.bytes),
            contents: Cell::new(limits.bytes),
            files: Cell::new(limits.files),
            spent: Cell::new(false),
        }
    }

    /// The refusal naming the top chart, the place inside it (`name` in `location`) and the limit.
    fn refuse(location: &Location, name: &str, limit: Limit) -> ChartError {
        ChartError::TooLarge {
            chart: location.top(),
            inside: location.inside(name),
            limit,
        }
    }

    fn bytes_limit(&self) -> Limit {
        Limit::Bytes(self.limits.bytes)
    }

    /// Counts one more file, `name` of `location`.
    fn file(&self, location: &Location, name: &str) -> Result<(), ChartError> {
        match self.files.get().checked_sub(1) {
            Some(left) => {
                self.files.set(left);
                Ok(())
            }
            None => Err(Budget::refuse(
                location,
                name,
                Limit::Files(self.limits.files),
            )),
        }
    }

    /// Checks that a subchart at `location` is at most `depth` levels deep.
    fn descend(&self, location: &Location, depth: usize) -> Result<(), ChartError> {
        if depth > self.limits.depth {
            return Err(Budget::refuse(
                location,
                "",
                Limit::Depth(self.limits.depth),
            ));
        }
        Ok(())
    }

    /// Takes `read` bytes of file contents of `name`, which claimed `size`; refuses a file over
    /// the file size limit or the tree's bytes.
    fn contents(&self, location: &Location, name: &str, read: u64) -> Result<(), ChartError> {
        if read > self.limits.file_size {
            return Err(Budget::refuse(
                location,
                name,
                Limit::FileSize(self.limits.file_size),
            ));
        }
        match self.contents.get().checked_sub(read) {
            Some(left) => {
                self.contents.set(left);
                Ok(())
            }
            None => Err(Budget::refuse(location, name, self.bytes_limit())),
        }
    }

    /// How many bytes of one file may be read: one past what either limit allows, so that a
    /// file past it is seen.
    fn readable(&self) -> u64 {
        self.limits
            .file_size
            .min(self.contents.get())
            .min(self.bytes.get())
            + 1
    }
}

/// A reader that takes every byte it gives from the budget, and fails once it is spent.
struct Metered<'b, R> {
    inner: R,
    budget: &'b Budget,
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.budget.bytes.get();
        let room = usize::try_from(left.saturating_add(1))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let read = self.inner.read(&mut buf[..room])?;
        match left.checked_sub(read as u64) {
            Some(rest) => {
                self.budget.bytes.set(rest);
                Ok(read)
            }
            None => {
                self.budget.spent.set(true);
                self.budget.bytes.set(0);
                Err(std::io::Error::other("the chart's byte budget is spent"))
            }
        }
    }
}

/// The files of one chart that sequencing reads, by path relative to the chart root:
/// Chart.yaml, requirements.yaml, the CRD files of crds/, and everything under charts/ (the
/// contents only of what is read later: Chart.yaml, requirements.yaml, CRD files and packaged
/// charts).
type Files = BTreeMap<String, Vec<u8>>;

/// The same files, borrowed: a subchart's view of its parent's files, without copying them.
type FileView<'a> = BTreeMap<&'a str, &'a [u8]>;

fn view(files: &Files) -> FileView<'_> {
    files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect()
}

/// A chart tree read within the limits, not parsed yet: each chart's Chart.yaml and
/// requirements.yaml, and its subcharts (or what is wrong with one, told when it is built).
#[derive(Debug)]
pub struct Gathered {
    location: Location,
    files: Files,
    /// The files of its `crds/` directory that Helm reads as CRDs.
    crds: Vec<ChartFile>,
    subcharts: Vec<Result<Gathered, ChartError>>,
}

impl Gathered {
    /// Parses the Chart.yaml files of the tree.
    pub fn build(self) -> Result<Chart, ChartError> {
        let metadata = read_metadata(&view(&self.files), &self.location)?;
        let subcharts = self
            .subcharts
            .into_iter()
            .map(|subchart| subchart.and_then(Gathered::build))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Chart {
            metadata,
            subcharts,
            location: self.location,
            crds: self.crds,
        })
    }
}

/// Loads the chart at `path`: a chart directory or a packaged chart (.tgz), within
/// [`Limits::DEFAULT`].
pub fn load(path: &Path) -> Result<Chart, ChartError> {
    gather(path, &Limits::DEFAULT)?.build()
}

/// Reads the chart tree at `path` (a chart directory or a packaged chart) within `limits`.
pub fn gather(path: &Path, limits: &Limits) -> Result<Gathered, ChartError> {
    let display = path.display().to_string();
    let metadata = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ChartError::NotFound {
            path: display.clone(),
        },
        _ => ChartError::Read {
            path: display.clone(),
            message: io_message(&e),
        },
    })?;
    let budget = Budget::new(limits);
    if metadata.is_dir() {
        if !path.join("Chart.yaml").is_file() {
            return Err(ChartError::NotAChart {
                path: display,
                reason: "the directory has no Chart.yaml".to_string(),
            });
        }
        let rules = match std::fs::read_to_string(path.join(".helmignore")) {
            Ok(text) => Rules::parse(&text).map_err(|message| ChartError::Read {
                path: path.join(".helmignore").display().to_string(),
                message,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Rules::default(),
            Err(e) => {
                return Err(ChartError::Read {
                    path: path.join(".helmignore").display().to_string(),
                    message: io_message(&e),
                });
            }
        };
        let location = Location::directory(display);
        let mut files = Files::new();
        collect_directory(path, "", 0, &rules, &location, &mut files, &budget)?;
        gather_files(&view(&files), location, 0, &budget)
    } else {
        let location = Location::archive(display.clone());
        let bytes = read_limited(path, &location, "", &budget)?;
        let files = read_archive(&bytes, &location, &budget)?;
        drop(bytes);
        gather_files(&view(&files), location, 0, &budget)
    }
}

/// Loads a packaged chart from its bytes within [`Limits::DEFAULT`]; `location` names it in
/// messages.
pub fn load_archive(bytes: &[u8], location: Location) -> Result<Chart, ChartError> {
    load_archive_with(bytes, location, &Limits::DEFAULT)
}

/// Loads a packaged chart from its bytes within `limits`.
pub fn load_archive_with(
    bytes: &[u8],
    location: Location,
    limits: &Limits,
) -> Result<Chart, ChartError> {
    gather_archive(bytes, location, limits)?.build()
}

/// Reads the tree of a packaged chart from its bytes within `limits`.
pub fn gather_archive(
    bytes: &[u8],
    location: Location,
    limits: &Limits,
) -> Result<Gathered, ChartError> {
    let budget = Budget::new(limits);
    let files = read_archive(bytes, &location, &budget)?;
    gather_files(&view(&files), location, 0, &budget)
}

/// Reads what sequencing needs from a chart directory (`rel` is the chart's directory relative
/// to the top chart, empty or ending in `/`, `depth` levels of subcharts below it).
fn collect_directory(
    top: &Path,
    rel: &str,
    depth: usize,
    rules: &Rules,
    location: &Location,
    files: &mut Files,
    budget: &Budget,
) -> Result<(), ChartError> {
    for name in ["Chart.yaml", "requirements.yaml"] {
        let relative = format!("{rel}{name}");
        let full = top.join(&relative);
        if full.is_file() && !rules.ignores(&relative, false) {
            let bytes = read_limited(&full, location, &relative, budget)?;
            files.insert(relative, strip_bom(bytes));
        }
    }
    collect_crds(top, &format!("{rel}crds"), rules, location, files, budget)?;
    let charts_rel = format!("{rel}charts");
    let charts_dir = top.join(&charts_rel);
    if !charts_dir.is_dir() || rules.ignores(&charts_rel, true) {
        return Ok(());
    }
    let entries = std::fs::read_dir(&charts_dir).map_err(|e| ChartError::Read {
        path: charts_dir.display().to_string(),
        message: io_message(&e),
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let relative = format!("{charts_rel}/{name}");
        let full = top.join(&relative);
        let metadata = std::fs::metadata(&full).map_err(|e| ChartError::Read {
            path: full.display().to_string(),
            message: io_message(&e),
        })?;
        if rules.ignores(&relative, metadata.is_dir()) || name.starts_with(['_', '.']) {
            continue;
        }
        if metadata.is_dir() {
            let has_entries = std::fs::read_dir(&full)
                .map(|mut d| d.next().is_some())
                .unwrap_or(false);
            if !has_entries {
                // Helm sees no files in an empty directory, so no subchart either.
                continue;
            }
            if !full.join("Chart.yaml").is_file()
                || rules.ignores(&format!("{relative}/Chart.yaml"), false)
            {
                return Err(ChartError::NotAChart {
                    path: full.display().to_string(),
                    reason: "it is in charts/ but has no Chart.yaml".to_string(),
                });
            }
            // A symbolic link back up the tree would lead here for ever.
            budget.descend(&location.subchart_path(&relative), depth + 1)?;
            collect_directory(
                top,
                &format!("{relative}/"),
                depth + 1,
                rules,
                location,
                files,
                budget,
            )?;
        } else if metadata.is_file() {
            if name.ends_with(".prov") {
                continue;
            }
            let bytes = read_limited(&full, location, &relative, budget)?;
            files.insert(relative, bytes);
        } else {
            return Err(ChartError::Read {
                path: full.display().to_string(),
                message:
                    "cannot load an irregular file (device, socket or pipe) as part of a chart"
                        .to_string(),
            });
        }
    }
    Ok(())
}

/// The CRD files under the directory `rel` (`crds`, `charts/x/crds`, and below), as Helm's
/// directory loader walks them: `.helmignore` applies to files and directories alike, hidden
/// files are read.
fn collect_crds(
    top: &Path,
    rel: &str,
    rules: &Rules,
    location: &Location,
    files: &mut Files,
    budget: &Budget,
) -> Result<(), ChartError> {
    let dir = top.join(rel);
    if !dir.is_dir() || rules.ignores(rel, true) {
        return Ok(());
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| ChartError::Read {
        path: dir.display().to_string(),
        message: io_message(&e),
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let relative = format!("{rel}/{name}");
        let full = top.join(&relative);
        let Ok(metadata) = std::fs::metadata(&full) else {
            // Helm reports what it cannot read; it rendered the chart before this runs.
            continue;
        };
        if metadata.is_dir() {
            collect_crds(top, &relative, rules, location, files, budget)?;
        } else if metadata.is_file() && !rules.ignores(&relative, false) && is_crd_path(&relative) {
            let bytes = read_limited(&full, location, &relative, budget)?;
            files.insert(relative, strip_bom(bytes));
        }
    }
    Ok(())
}

/// Whether `path` (relative to the top chart) is a CRD file of the top chart or of a subchart
/// directory: `crds/x.yaml`, `charts/a/crds/x.yaml`.
fn is_crd_path(path: &str) -> bool {
    let mut rest = path;
    while let Some(inner) = rest.strip_prefix("charts/") {
        match inner.split_once('/') {
            Some((_, after)) => rest = after,
            None => return false,
        }
    }
    super::is_crd_file(rest)
}

/// Reads the file at `path` (`name` of `location`; empty for the top archive itself), taking it
/// from the budget. The top archive is not taken (what it decompresses to is), but may be no
/// larger than the budget.
fn read_limited(
    path: &Path,
    location: &Location,
    name: &str,
    budget: &Budget,
) -> Result<Vec<u8>, ChartError> {
    let display = path.display().to_string();
    let io = |e: std::io::Error| ChartError::Read {
        path: display.clone(),
        message: io_message(&e),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let too_large = || Budget::refuse(location, name, budget.bytes_limit());
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    if name.is_empty() {
        let limit = budget.limits.bytes;
        if size > limit {
            return Err(too_large());
        }
        // Read no more than that, should the file have grown since.
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > limit {
            return Err(too_large());
        }
        return Ok(bytes);
    }
    budget.file(location, name)?;
    let file_size = Limit::FileSize(budget.limits.file_size);
    if size > budget.limits.file_size {
        return Err(Budget::refuse(location, name, file_size));
    }
    if size > budget.bytes.get() {
        return Err(too_large());
    }
    let read = Metered {
        inner: file,
        budget,
    }
    .take(budget.readable())
    .read_to_end(&mut bytes);
    if budget.spent.get() {
        return Err(too_large());
    }
    read.map_err(io)?;
    if bytes.len() as u64 > budget.limits.file_size {
        return Err(Budget::refuse(location, name, file_size));
    }
    Ok(bytes)
}

fn strip_bom(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        bytes.drain(..3);
    }
    bytes
}

/// The files of the packaged chart `bytes` at `location`, relative to its top directory, with
/// Helm's safety rules, taken from the budget.
fn read_archive(bytes: &[u8], location: &Location, budget: &Budget) -> Result<Files, ChartError> {
    let archive_error = |message: String| ChartError::Archive {
        path: location.to_string(),
        message,
    };
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(archive_error("not a packaged chart: the file is not gzip-compressed (expected a .tgz made by helm package)".to_string()));
    }
    // Every gzip member, as Go's reader (and so helm) reads them: a second member is not a
    // place to hide files from this loader.
    let decoder = flate2::read::MultiGzDecoder::new(bytes);
    let mut archive = tar::Archive::new(Metered {
        inner: decoder,
        budget,
    });
    // What the parser made of a read the budget stopped does not matter: the budget is spent.
    let failed = |error: std::io::Error, name: &str, what: &str| {
        if budget.spent.get() {
            Budget::refuse(location, name, budget.bytes_limit())
        } else {
            archive_error(format!("{what}: {error}"))
        }
    };
    let entries = archive
        .entries()
        .map_err(|e| failed(e, "", "cannot read the archive"))?;
    let mut files = Files::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| failed(e, "", "corrupt archive"))?;
        let raw_name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind.is_dir() || kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            budget.file(location, &raw_name)?;
            continue;
        }
        let separator = if raw_name.contains('\\') { '\\' } else { '/' };
        let parts: Vec<&str> = raw_name.split(separator).collect();
        if parts.first() == Some(&"Chart.yaml") {
            return Err(archive_error(
                "Chart.yaml is not inside the chart's top directory".to_string(),
            ));
        }
        let name = clean_path(&parts[1.min(parts.len())..].join("/")).ok_or_else(|| {
            archive_error(format!(
                "the archive holds a path outside the chart: {raw_name:?}"
            ))
        })?;
        budget.file(location, &name)?;
        let size = entry.size();
        if size > budget.limits.file_size {
            return Err(Budget::refuse(
                location,
                &name,
                Limit::FileSize(budget.limits.file_size),
            ));
        }
        if size > budget.contents.get() || size > budget.bytes.get() {
            return Err(Budget::refuse(location, &name, budget.bytes_limit()));
        }
        let limit = budget.readable();
        let (read, data) = if wanted(&name) && needed(&name) {
            let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            let read = (&mut entry).take(limit).read_to_end(&mut data);
            (read, data)
        } else {
            // Read through, so that it is counted, but not kept.
            let read = std::io::copy(&mut (&mut entry).take(limit), &mut std::io::sink())
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            (read, Vec::new())
        };
        let read = read.map_err(|e| failed(e, &name, "corrupt archive"))? as u64;
        budget.contents(location, &name, read)?;
        if read < size {
            return Err(archive_error(
                "corrupt archive: a file is shorter than its header says".to_string(),
            ));
        }
        if wanted(&name) {
            files.insert(name, strip_bom(data));
        }
    }
    if files.is_empty() {
        return Err(archive_error("no chart files in the archive".to_string()));
    }
    Ok(files)
}

/// Whether the loader keeps a file of an archive (its name at least: the files under charts/
/// tell which subcharts there are).
fn wanted(name: &str) -> bool {
    matches!(name, "Chart.yaml" | "requirements.yaml")
        || super::is_crd_file(name)
        || (name.starts_with("charts/") && !name.ends_with(".prov"))
}

/// Whether the loader reads a file's contents: a Chart.yaml, a requirements.yaml, a CRD file or
/// a packaged chart, at any level.
fn needed(name: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    matches!(file, "Chart.yaml" | "requirements.yaml")
        || file.ends_with(".tgz")
        || is_crd_path(name)
}

/// Normalizes a path inside an archive; `None` when it is absolute or leaves the chart.
fn clean_path(path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty()
        || parts
            .first()
            .is_some_and(|p| p.len() == 2 && p.ends_with(':'))
    {
        return None;
    }
    Some(parts.join("/"))
}

/// The top Chart.yaml of a packaged chart on disk (what `helm pull` wrote), read within
/// [`Limits::DEFAULT`].
pub(super) fn archive_metadata(path: &Path) -> Result<Metadata, ChartError> {
    let location = Location::archive(path.display().to_string());
    let budget = Budget::new(&Limits::DEFAULT);
    let bytes = read_limited(path, &location, "", &budget)?;
    let files = read_archive(&bytes, &location, &budget)?;
    read_metadata(&view(&files), &location)
}

/// Chart.yaml (with requirements.yaml of apiVersion v1 charts) of the chart whose files these are.
fn read_metadata(files: &FileView<'_>, location: &Location) -> Result<Metadata, ChartError> {
    let chart_file = location.file("Chart.yaml");
    let chart_yaml = files
        .get("Chart.yaml")
        .ok_or_else(|| ChartError::NotAChart {
            path: location.to_string(),
            reason: "Chart.yaml file is missing".to_string(),
        })?;
    let text = utf8(chart_yaml, &chart_file)?;
    let document = crate::yaml::parse(text).map_err(|e| ChartError::ChartYaml {
        file: chart_file.clone(),
        message: format!("invalid YAML at {e}"),
    })?;
    let mut metadata = parse_metadata(&document).map_err(|message| ChartError::ChartYaml {
        file: chart_file.clone(),
        message,
    })?;
    if metadata.api_version.is_empty() {
        metadata.api_version = "v1".to_string();
    }
    if let Some(requirements) = files.get("requirements.yaml") {
        let file = location.file("requirements.yaml");
        let document =
            crate::yaml::parse(utf8(requirements, &file)?).map_err(|e| ChartError::ChartYaml {
                file: file.clone(),
                message: format!("invalid YAML at {e}"),
            })?;
        if let Some(dependencies) =
            parse_requirements(&document).map_err(|message| ChartError::ChartYaml {
                file: file.clone(),
                message,
            })?
        {
            metadata.dependencies = Some(dependencies);
        }
    }
    if metadata.name.is_empty() {
        return Err(ChartError::ChartYaml {
            file: chart_file,
            message: "chart.metadata.name is required".to_string(),
        });
    }
    Ok(metadata)
}

/// Reads the subcharts of the chart whose files these are (`depth` levels below the top chart),
/// each packaged one from its archive, within the budget. What is wrong with a subchart's place
/// in charts/ is kept for [`Gathered::build`]; a limit stops it at once.
fn gather_files(
    files: &FileView<'_>,
    location: Location,
    depth: usize,
    budget: &Budget,
) -> Result<Gathered, ChartError> {
    let own: Files = ["Chart.yaml", "requirements.yaml"]
        .into_iter()
        .filter_map(|name| Some((name.to_string(), files.get(name)?.to_vec())))
        .collect();
    let crds = files
        .iter()
        .filter(|(name, _)| super::is_crd_file(name))
        .map(|(name, data)| ChartFile {
            name: name.to_string(),
            data: data.to_vec(),
        })
        .collect();
    // Group charts/ by the first path element after it, as Helm does.
    let mut groups: BTreeMap<&str, FileView<'_>> = BTreeMap::new();
    for (name, data) in files {
        let Some(rest) = name.strip_prefix("charts/") else {
            continue;
        };
        // A file directly in charts/ (a packaged chart) is its own group, under the empty name.
        let (group, inner) = rest.split_once('/').unwrap_or((rest, ""));
        groups.entry(group).or_default().insert(inner, data);
    }
    let mut subcharts = Vec::with_capacity(groups.len());
    for (group, group_files) in groups {
        if group.starts_with(['_', '.']) {
            continue;
        }
        if group.ends_with(".tgz") {
            let Some(bytes) = group_files.get("") else {
                subcharts.push(Err(ChartError::NotAChart {
                    path: location.file(&format!("charts/{group}")),
                    reason: "a directory named like a packaged chart".to_string(),
                }));
                continue;
            };
            let sub_location = location.subchart_archive(group);
            budget.descend(&sub_location, depth + 1)?;
            let sub_files = read_archive(bytes, &sub_location, budget)?;
            subcharts.push(Ok(gather_files(
                &view(&sub_files),
                sub_location,
                depth + 1,
                budget,
            )?));
        } else {
            let sub_location = location.subchart_directory(group);
            if group_files.contains_key("") || !group_files.contains_key("Chart.yaml") {
                subcharts.push(Err(ChartError::NotAChart {
                    path: location.file(&format!("charts/{group}")),
                    reason: "it is in charts/ but is neither a chart directory nor a packaged chart (.tgz)".to_string(),
                }));
                continue;
            }
            budget.descend(&sub_location, depth + 1)?;
            subcharts.push(Ok(gather_files(
                &group_files,
                sub_location,
                depth + 1,
                budget,
            )?));
        }
    }
    Ok(Gathered {
        location,
        files: own,
        crds,
        subcharts,
    })
}

fn utf8<'a>(bytes: &'a [u8], file: &str) -> Result<&'a str, ChartError> {
    std::str::from_utf8(bytes).map_err(|e| ChartError::ChartYaml {
        file: file.to_string(),
        message: format!("not UTF-8 text: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_path_rejects_escapes() {
        assert_eq!(
            clean_path("templates/a.yaml").as_deref(),
            Some("templates/a.yaml")
        );
        assert_eq!(
            clean_path("./x/../Chart.yaml").as_deref(),
            Some("Chart.yaml")
        );
        assert_eq!(clean_path("../etc/passwd"), None);
        assert_eq!(clean_path("/abs"), None);
        assert_eq!(clean_path("c:/x"), None);
        assert_eq!(clean_path(""), None);
    }

    #[test]
    fn a_non_gzip_file_is_not_a_packaged_chart() {
        let location = Location::archive("x.tgz");
        let budget = Budget::new(&Limits::DEFAULT);
        let err = read_archive(b"hello", &location, &budget)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not gzip-compressed"), "{err}");
        let err = read_archive(&[0x1f, 0x8b, 0, 1, 2], &location, &budget)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("corrupt") || err.contains("cannot read"),
            "{err}"
        );
    }
}
