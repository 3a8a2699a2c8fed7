//! Reading the Chart.yaml files of a chart directory or packaged chart and its subcharts,
//! following Helm's loader: `.helmignore` for directories, the archive rules (one top directory,
//! no paths outside it, size limits), subcharts as directories or `.tgz` files in `charts/`,
//! names starting with `_` or `.` skipped, `.prov` files ignored.
//!
//! Charts are rendered by `helm template` before they are loaded here, so Helm has already
//! reported what it finds wrong with a chart (a missing dependency, an invalid version, a
//! values.yaml that is not YAML); this loader keeps only the checks it needs to read safely.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::helmignore::Rules;
use super::metadata::{parse_metadata, parse_requirements};
use super::{Chart, ChartError, ChartFile, Location, Metadata, io_message};

/// Helm's limit on a whole decompressed chart.
const MAX_CHART_SIZE: u64 = 100 * 1024 * 1024;
/// Helm's limit on one file of a chart.
const MAX_FILE_SIZE: u64 = 5 * 1024 * 1024;

/// The files of one chart that sequencing reads, by path relative to the chart root:
/// Chart.yaml, requirements.yaml, the CRD files of crds/, and everything under charts/.
type Files = BTreeMap<String, Vec<u8>>;

/// The same files, borrowed: a subchart's view of its parent's files, without copying them.
type FileView<'a> = BTreeMap<&'a str, &'a [u8]>;

fn view(files: &Files) -> FileView<'_> {
    files
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect()
}

/// Loads the chart at `path`: a chart directory or a packaged chart (.tgz).
pub fn load(path: &Path) -> Result<Chart, ChartError> {
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
        let mut files = Files::new();
        let mut budget = MAX_CHART_SIZE;
        collect_directory(path, "", &rules, &mut files, &mut budget)?;
        load_files(&view(&files), Location::directory(display))
    } else {
        let bytes = std::fs::read(path).map_err(|e| ChartError::Read {
            path: display.clone(),
            message: io_message(&e),
        })?;
        load_archive(&bytes, Location::archive(display))
    }
}

/// Loads a packaged chart from its bytes; `location` names it in messages.
pub fn load_archive(bytes: &[u8], location: Location) -> Result<Chart, ChartError> {
    let files = read_archive(bytes).map_err(|message| ChartError::Archive {
        path: location.to_string(),
        message,
    })?;
    load_files(&view(&files), location)
}

/// Reads what sequencing needs from a chart directory (`rel` is the chart's directory relative
/// to the top chart, empty or ending in `/`).
fn collect_directory(
    top: &Path,
    rel: &str,
    rules: &Rules,
    files: &mut Files,
    budget: &mut u64,
) -> Result<(), ChartError> {
    for name in ["Chart.yaml", "requirements.yaml"] {
        let relative = format!("{rel}{name}");
        let full = top.join(&relative);
        if full.is_file() && !rules.ignores(&relative, false) {
            files.insert(relative, read_limited(&full, budget)?);
        }
    }
    collect_crds(top, &format!("{rel}crds"), rules, files, budget)?;
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
            collect_directory(top, &format!("{relative}/"), rules, files, budget)?;
        } else if metadata.is_file() {
            if name.ends_with(".prov") {
                continue;
            }
            files.insert(relative, read_limited(&full, budget)?);
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
    files: &mut Files,
    budget: &mut u64,
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
            collect_crds(top, &relative, rules, files, budget)?;
        } else if metadata.is_file() && !rules.ignores(&relative, false) && is_crd_path(&relative) {
            files.insert(relative, read_limited(&full, budget)?);
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

fn read_limited(path: &Path, budget: &mut u64) -> Result<Vec<u8>, ChartError> {
    let display = path.display().to_string();
    let size = std::fs::metadata(path)
        .map_err(|e| ChartError::Read {
            path: display.clone(),
            message: io_message(&e),
        })?
        .len();
    let is_archive = display.ends_with(".tgz");
    if !is_archive && size > MAX_FILE_SIZE {
        return Err(ChartError::Read {
            path: display,
            message: format!("the file is larger than Helm's limit of {MAX_FILE_SIZE} bytes"),
        });
    }
    if size > *budget {
        return Err(ChartError::Read {
            path: display,
            message: format!("the chart is larger than Helm's limit of {MAX_CHART_SIZE} bytes"),
        });
    }
    *budget -= size;
    let bytes = std::fs::read(path).map_err(|e| ChartError::Read {
        path: display,
        message: io_message(&e),
    })?;
    Ok(strip_bom(bytes))
}

fn strip_bom(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        bytes.drain(..3);
    }
    bytes
}

/// The files of a packaged chart, relative to its top directory, with Helm's safety rules.
fn read_archive(bytes: &[u8]) -> Result<Files, String> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Err("not a packaged chart: the file is not gzip-compressed (expected a .tgz made by helm package)".to_string());
    }
    let decoder = flate2::read::GzDecoder::new(bytes);
    let mut archive = tar::Archive::new(decoder);
    let entries = archive
        .entries()
        .map_err(|e| format!("cannot read the archive: {e}"))?;
    let mut files = Files::new();
    let mut remaining = MAX_CHART_SIZE;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("corrupt archive: {e}"))?;
        let kind = entry.header().entry_type();
        if kind.is_dir() || kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        }
        let raw_name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let separator = if raw_name.contains('\\') { '\\' } else { '/' };
        let parts: Vec<&str> = raw_name.split(separator).collect();
        if parts.first() == Some(&"Chart.yaml") {
            return Err("Chart.yaml is not inside the chart's top directory".to_string());
        }
        let name = clean_path(&parts[1.min(parts.len())..].join("/"))
            .ok_or_else(|| format!("the archive holds a path outside the chart: {raw_name:?}"))?;
        let size = entry.header().size().unwrap_or(0);
        if size > MAX_FILE_SIZE && !name.ends_with(".tgz") {
            return Err(format!(
                "file {raw_name:?} is larger than Helm's limit of {MAX_FILE_SIZE} bytes"
            ));
        }
        if size > remaining {
            return Err(format!(
                "the decompressed chart is larger than Helm's limit of {MAX_CHART_SIZE} bytes"
            ));
        }
        let mut data = Vec::with_capacity(size.min(MAX_FILE_SIZE) as usize);
        let read = (&mut entry)
            .take(remaining)
            .read_to_end(&mut data)
            .map_err(|e| format!("corrupt archive: {e}"))? as u64;
        if read < size {
            return Err("corrupt archive: a file is shorter than its header says".to_string());
        }
        remaining -= read;
        if wanted(&name) {
            files.insert(name, strip_bom(data));
        }
    }
    if files.is_empty() {
        return Err("no chart files in the archive".to_string());
    }
    Ok(files)
}

/// Whether the loader needs a file of an archive.
fn wanted(name: &str) -> bool {
    matches!(name, "Chart.yaml" | "requirements.yaml")
        || super::is_crd_file(name)
        || (name.starts_with("charts/") && !name.ends_with(".prov"))
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

/// The top Chart.yaml of a packaged chart on disk (what `helm pull` wrote).
pub(super) fn archive_metadata(path: &Path) -> Result<Metadata, ChartError> {
    let location = Location::archive(path.display().to_string());
    let bytes = std::fs::read(path).map_err(|e| ChartError::Read {
        path: path.display().to_string(),
        message: io_message(&e),
    })?;
    let files = read_archive(&bytes).map_err(|message| ChartError::Archive {
        path: location.to_string(),
        message,
    })?;
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

/// Builds a chart from its files, loading its subcharts recursively.
fn load_files(files: &FileView<'_>, location: Location) -> Result<Chart, ChartError> {
    let metadata = read_metadata(files, &location)?;

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
                return Err(ChartError::NotAChart {
                    path: location.file(&format!("charts/{group}")),
                    reason: "a directory named like a packaged chart".to_string(),
                });
            };
            subcharts.push(load_archive(bytes, location.subchart_archive(group))?);
        } else {
            let sub_location = location.subchart_directory(group);
            if group_files.contains_key("") || !group_files.contains_key("Chart.yaml") {
                return Err(ChartError::NotAChart {
                    path: location.file(&format!("charts/{group}")),
                    reason: "it is in charts/ but is neither a chart directory nor a packaged chart (.tgz)".to_string(),
                });
            }
            subcharts.push(load_files(&group_files, sub_location)?);
        }
    }
    let crds = files
        .iter()
        .filter(|(name, _)| super::is_crd_file(name))
        .map(|(name, data)| ChartFile {
            name: name.to_string(),
            data: data.to_vec(),
        })
        .collect();
    Ok(Chart {
        metadata,
        subcharts,
        location,
        crds,
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
        let err = read_archive(b"hello").unwrap_err();
        assert!(err.contains("not gzip-compressed"), "{err}");
        let err = read_archive(&[0x1f, 0x8b, 0, 1, 2]).unwrap_err();
        assert!(
            err.contains("corrupt") || err.contains("cannot read"),
            "{err}"
        );
    }
}
