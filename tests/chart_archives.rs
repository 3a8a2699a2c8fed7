//! Chart archives that try to exhaust the operator: one budget of bytes and files for a whole
//! chart tree, every nested archive included, a cap on the depth of subcharts, and each refusal
//! naming the chart, the place inside it and the limit, before helm ever reads the chart. The
//! real helm is the oracle of what it loads itself (it gives every nested archive a fresh
//! 100 MiB). The property test feeds the fuzz target's generator of hostile archives
//! (`support::archives`) to the loader, as `fuzz/fuzz_targets/chart_archive.rs` does on nightly.

use sequenced_testkit as support;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use sequenced::chart::{self, ChartError, Limit, Limits, Location};
use sequenced::helm::Helm;
use sequenced::pipeline::{self, RenderRequest};
use support::archives::{self, Tar, gzip};
use tempfile::TempDir;

#[global_allocator]
static ALLOCATOR: archives::Counting = archives::Counting;

const MIB: u64 = 1024 * 1024;

/// A packaged chart `name` (top directory `name`) holding Chart.yaml, one ConfigMap template,
/// `zeros` files of `size` zero bytes under `files/` (loaded by helm, rendered by nothing), and
/// `subcharts` (file name and bytes) in charts/; streamed, so no zeros are held in memory.
fn packaged(name: &str, zeros: usize, size: u64, subcharts: &[(&str, &[u8])]) -> Vec<u8> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut builder = tar::Builder::new(encoder);
    let mut add = |path: &str, size: u64, data: &mut dyn std::io::Read| {
        let mut header = tar::Header::new_gnu();
        header.set_size(size);
        header.set_mode(0o644);
        header.set_mtime(0);
        builder
            .append_data(&mut header, format!("{name}/{path}"), data)
            .expect("append");
    };
    let chart_yaml = format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n");
    add(
        "Chart.yaml",
        chart_yaml.len() as u64,
        &mut chart_yaml.as_bytes(),
    );
    let template = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}-{name}\n"
    );
    add(
        "templates/configmap.yaml",
        template.len() as u64,
        &mut template.as_bytes(),
    );
    for index in 0..zeros {
        add(
            &format!("files/zeros-{index}.bin"),
            size,
            &mut std::io::repeat(0).take(size),
        );
    }
    for (file, bytes) in subcharts {
        add(
            &format!("charts/{file}"),
            bytes.len() as u64,
            &mut &bytes[..],
        );
    }
    builder
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .expect("finish the archive")
}

fn write_archive(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).expect("write the archive");
    path
}

/// `helm template` of the chart at `path`: whether it succeeded, and what it said.
fn helm_template(path: &Path) -> (bool, String) {
    let output = Command::new(support::helm())
        .args(["template", "r"])
        .arg(path)
        .output()
        .expect("run helm");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A helm that only notes it was run (and fails): the chart pipeline must not get that far.
fn tripwire_helm(dir: &TempDir) -> (Helm, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let marker = dir.path().join("helm-was-run");
    let script = dir.path().join("helm");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ntouch '{}'\nexit 1\n", marker.display()),
    )
    .expect("write the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (Helm::at(script), marker)
}

/// The chart pipeline on `path` with a helm that must never run: its error.
fn refused_before_helm(path: &Path) -> ChartError {
    let dir = TempDir::new().unwrap();
    let (helm, marker) = tripwire_helm(&dir);
    let request = RenderRequest {
        release_name: "r".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let error = support::pipeline_render(&helm, path, &request).expect_err("refused");
    assert!(
        !marker.exists(),
        "helm was run on a chart the loader refuses"
    );
    assert_eq!(error.reason(), sequenced::api::Reason::InvalidChart);
    assert!(!error.is_transient(), "{error}");
    match error {
        pipeline::Error::Chart(error) => error,
        other => panic!("not a chart error: {other}"),
    }
}

#[test]
fn nested_archives_share_one_budget_that_helm_gives_each_afresh() {
    let dir = TempDir::new().unwrap();
    // Each archive decompresses to 95 MiB, under Helm's 100 MiB for one archive: helm loads
    // the tree, 190 MiB, from a file of a few hundred KiB.
    let inner = packaged("inner", 19, 5 * MIB, &[]);
    let outer = packaged("outer", 19, 5 * MIB, &[("inner-0.1.0.tgz", &inner)]);
    let path = write_archive(&dir, "outer-0.1.0.tgz", &outer);
    assert!(outer.len() < 2 * MIB as usize, "{} bytes", outer.len());
    let (loaded, stderr) = helm_template(&path);
    assert!(loaded, "helm loads it: {stderr}");
    // Alone, each loads here too.
    let alone = write_archive(&dir, "inner-0.1.0.tgz", &inner);
    chart::load(&alone).expect("95 MiB in one archive loads");
    // Refused having held a fraction of it.
    let (refused, peak) = archives::peak_during(|| chart::load(&path));
    assert!(refused.is_err());
    eprintln!("the loader's peak heap refusing the 190 MiB tree: {peak} bytes");
    assert!(peak <= archives::heap_allowed(&Limits::DEFAULT), "{peak}");
    let error = refused_before_helm(&path);
    let ChartError::TooLarge {
        chart,
        inside,
        limit,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(chart, &path.display().to_string());
    assert!(
        inside.starts_with("charts/inner-0.1.0.tgz:files/zeros-"),
        "{inside}"
    );
    assert_eq!(*limit, Limit::Bytes(100 * MIB));
    assert_eq!(
        error.to_string(),
        format!(
            "chart {}: {inside}: the chart decompresses to more than 104857600 bytes, the \
             limit for a whole chart tree with every archive nested in it",
            path.display()
        )
    );
}

#[test]
fn subcharts_ten_levels_deep_load_and_eleven_are_refused() {
    let dir = TempDir::new().unwrap();
    // l1 holds l2 holds ... l11: ten levels of subcharts below the top chart.
    let ten = write_archive(&dir, "ten.tgz", &archives::chain(11));
    let chart = chart::load(&ten).expect("ten levels load");
    let mut deepest = &chart;
    let mut levels = 0;
    while let Some(sub) = deepest.subcharts.first() {
        deepest = sub;
        levels += 1;
    }
    assert_eq!((levels, deepest.metadata.name.as_str()), (10, "l11"));
    assert!(helm_template(&ten).0, "helm renders it");
    let eleven = write_archive(&dir, "eleven.tgz", &archives::chain(12));
    assert!(helm_template(&eleven).0, "helm has no depth limit");
    let error = refused_before_helm(&eleven);
    let way: Vec<String> = (2..=12).map(|l| format!("charts/l{l}-0.1.0.tgz")).collect();
    assert_eq!(
        error.to_string(),
        format!(
            "chart {}: {}: subcharts are nested more than 10 levels deep, the limit for a chart \
             tree",
            eleven.display(),
            way.join(":")
        )
    );
}

#[test]
fn a_chart_directory_nested_past_the_limit_or_linked_into_itself_is_refused() {
    let dir = TempDir::new().unwrap();
    let top = dir.path().join("top");
    let mut chart_dir = top.clone();
    support::chart(&chart_dir, "top", "0.1.0", "");
    for level in 1..=11 {
        chart_dir = chart_dir.join(format!("charts/d{level}"));
        support::chart(&chart_dir, &format!("d{level}"), "0.1.0", "");
    }
    let error = chart::load(&top).unwrap_err();
    assert!(
        matches!(&error, ChartError::TooLarge { limit: Limit::Depth(10), inside, .. }
            if inside.ends_with("charts/d10/charts/d11")),
        "{error}"
    );
    // A symbolic link from a subchart back to the top chart: a tree without end.
    let looped = dir.path().join("looped");
    support::chart(&looped, "looped", "0.1.0", "");
    std::fs::create_dir_all(looped.join("charts")).unwrap();
    std::os::unix::fs::symlink(&looped, looped.join("charts/again")).unwrap();
    let error = chart::load(&looped).unwrap_err();
    assert!(
        matches!(
            &error,
            ChartError::TooLarge {
                limit: Limit::Depth(10),
                ..
            }
        ),
        "{error}"
    );
}

/// A packaged chart `name` with `count` empty templates, and `subcharts` in charts/.
fn many_files(name: &str, count: usize, subcharts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = Tar::default();
    tar.file(
        &format!("{name}/Chart.yaml"),
        format!("apiVersion: v2\nname: {name}\nversion: 0.1.0\n").as_bytes(),
    );
    for index in 0..count {
        tar.file(&format!("{name}/templates/empty-{index}.yaml"), b"");
    }
    for (file, bytes) in subcharts {
        tar.file(&format!("{name}/charts/{file}"), bytes);
    }
    gzip(&tar.finish(true))
}

#[test]
fn the_file_limit_counts_every_archive_of_the_tree() {
    let dir = TempDir::new().unwrap();
    // 10,000 files in one archive: Chart.yaml and 9,999 templates.
    let full = write_archive(&dir, "full.tgz", &many_files("full", 9_999, &[]));
    chart::load(&full).expect("10,000 files load");
    // 6,000 above and 4,001 below: each archive alone is within, the tree is not.
    let inner = many_files("inner", 4_000, &[]);
    let outer = many_files("outer", 5_998, &[("inner-0.1.0.tgz", &inner)]);
    let path = write_archive(&dir, "outer.tgz", &outer);
    let error = refused_before_helm(&path);
    assert!(
        matches!(&error, ChartError::TooLarge { limit: Limit::Files(10_000), inside, .. }
            if inside.starts_with("charts/inner-0.1.0.tgz:templates/empty-")),
        "{error}"
    );
}

#[test]
fn a_file_past_helms_size_limit_is_refused_as_helm_refuses_it() {
    let dir = TempDir::new().unwrap();
    let big = packaged("big", 1, 5 * MIB + 1, &[]);
    let path = write_archive(&dir, "big.tgz", &big);
    let (loaded, stderr) = helm_template(&path);
    // Helm says no more than that (the file size is in the error it does not print).
    assert!(!loaded, "helm refuses it too");
    assert!(stderr.contains("unable to load chart archive"), "{stderr}");
    let error = refused_before_helm(&path);
    assert_eq!(
        error.to_string(),
        format!(
            "chart {}: files/zeros-0.bin: the file is larger than 5242880 bytes, Helm's limit \
             for one file of a chart",
            path.display()
        )
    );
    // A packaged subchart is a file too, for helm as here.
    let inner = packaged("inner", 1, 5 * MIB + 1, &[]);
    assert!(inner.len() < 5 * MIB as usize);
    let path = write_archive(
        &dir,
        "outer.tgz",
        &packaged("outer", 0, 0, &[("inner-0.1.0.tgz", &inner)]),
    );
    let error = refused_before_helm(&path);
    assert!(
        matches!(&error, ChartError::TooLarge { limit: Limit::FileSize(_), inside, .. }
            if inside == "charts/inner-0.1.0.tgz:files/zeros-0.bin"),
        "{error}"
    );
}

#[test]
fn a_long_name_past_the_budget_is_refused_without_holding_it() {
    // The tar parser reads a GNU long name whole into memory: a name of 200 MiB of zeros is a
    // bomb of its own. The budget meters every byte gzip gives, headers and names included.
    let mut tar = Tar::default();
    tar.file("c/Chart.yaml", b"apiVersion: v2\nname: c\nversion: 0.1.0\n");
    let name = format!("c/charts/{}", "n".repeat(8 * 1024 * 1024));
    tar.file(&name, b"x");
    let bytes = gzip(&tar.finish(true));
    let limits = Limits {
        bytes: MIB,
        ..Limits::DEFAULT
    };
    let (result, peak) = archives::peak_during(|| {
        chart::load_archive_with(&bytes, Location::archive("long.tgz"), &limits)
    });
    let error = result.unwrap_err();
    assert!(
        matches!(&error, ChartError::TooLarge { limit: Limit::Bytes(n), .. } if *n == MIB),
        "{error}"
    );
    assert!(peak < 4 * MIB as usize, "{peak} bytes of heap");
}

#[test]
fn a_second_gzip_member_is_read_as_helm_reads_it() {
    // Go's gzip reader (helm's) reads every member of a file: a subchart after the first member
    // is a subchart, and must be counted.
    let dir = TempDir::new().unwrap();
    let mut first = Tar::default();
    first.file(
        "two/Chart.yaml",
        b"apiVersion: v2\nname: two\nversion: 0.1.0\n",
    );
    let mut second = Tar::default();
    second.file(
        "two/charts/hidden/Chart.yaml",
        b"apiVersion: v2\nname: hidden\nversion: 0.1.0\n",
    );
    second.file(
        "two/charts/hidden/templates/cm.yaml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hidden\n",
    );
    let mut bytes = gzip(&first.finish(false));
    bytes.extend(gzip(&second.finish(true)));
    let path = write_archive(&dir, "two.tgz", &bytes);
    assert_eq!(
        support::helm_chart_paths(&path, &[]),
        ["two/hidden".to_string()].into()
    );
    let chart = chart::load(&path).unwrap();
    assert_eq!(chart.subcharts[0].metadata.name, "hidden");
}

#[test]
fn paths_outside_the_chart_never_reach_helm_and_links_are_not_followed() {
    let dir = TempDir::new().unwrap();
    for name in ["../escape.yaml", "charts/../../escape.yaml", "/etc/passwd"] {
        let mut tar = Tar::default();
        tar.file("c/Chart.yaml", b"apiVersion: v2\nname: c\nversion: 0.1.0\n");
        tar.file(&format!("c/{name}"), b"x: 1\n");
        let path = write_archive(&dir, "escape.tgz", &gzip(&tar.finish(true)));
        let error = refused_before_helm(&path);
        assert!(
            error
                .to_string()
                .contains("the archive holds a path outside the chart"),
            "{name}: {error}"
        );
    }
    // A link is an empty file to Helm's loader, and to this one: nothing outside is read.
    let mut tar = Tar::default();
    tar.file("c/Chart.yaml", b"apiVersion: v2\nname: c\nversion: 0.1.0\n");
    tar.link(
        "c/charts/passwd.tgz",
        "/etc/passwd",
        tar::EntryType::Symlink,
    );
    let path = write_archive(&dir, "link.tgz", &gzip(&tar.finish(true)));
    let error = chart::load(&path).unwrap_err();
    assert!(
        error.to_string().contains(&format!(
            "chart archive {}:charts/passwd.tgz: not a packaged chart",
            path.display()
        )),
        "{error}"
    );
    let (loaded, _) = helm_template(&path);
    assert!(!loaded, "helm refuses it too");
}

#[test]
fn a_chart_within_every_limit_renders_as_before() {
    // The shop example, packaged by helm: loaded once, rendered by the real helm.
    let dir = TempDir::new().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let packaged = support::package(&root.join("examples/foo"), dir.path());
    let request = RenderRequest {
        release_name: "r".into(),
        namespace: "default".into(),
        ..Default::default()
    };
    let rendered =
        support::pipeline_render(&Helm::at(support::helm()), &packaged, &request).unwrap();
    let paths: Vec<&str> = rendered
        .tree
        .charts()
        .iter()
        .map(|c| c.path.as_str())
        .collect();
    assert_eq!(paths, ["foo", "foo/bar", "foo/nginx", "foo/rabbitmq"]);
}

/// The named hostile archives of the fuzz target's seed corpus, each with the limit it goes
/// past (None: it loads or is refused for what it is, not for a limit).
fn seeds() -> Vec<(&'static str, Vec<u8>, Option<Limit>)> {
    let small = archives::SMALL;
    let chart_yaml = b"apiVersion: v2\nname: c\nversion: 0.1.0\n";
    let with = |entries: &dyn Fn(&mut Tar)| {
        let mut tar = Tar::default();
        tar.file("c/Chart.yaml", chart_yaml);
        entries(&mut tar);
        gzip(&tar.finish(true))
    };
    let zeros = |n: u64| vec![0u8; n as usize];
    let nested_zeros = with(&|tar| {
        let inner = with(&|tar| tar.file("c/files/a.bin", &zeros(small.file_size)));
        tar.file("c/files/a.bin", &zeros(small.file_size));
        for i in 0..7 {
            tar.file(&format!("c/charts/s{i}-0.1.0.tgz"), &inner);
        }
    });
    vec![
        ("valid", with(&|_| {}), None),
        (
            "nested-budget",
            nested_zeros,
            Some(Limit::Bytes(small.bytes)),
        ),
        (
            "deep-chain",
            archives::chain(small.depth + 2),
            Some(Limit::Depth(small.depth)),
        ),
        (
            "deep-directories",
            with(&|tar| {
                let mut dir = String::from("c/");
                for level in 0..=small.depth {
                    dir.push_str(&format!("charts/d{level}/"));
                    tar.file(&format!("{dir}Chart.yaml"), chart_yaml);
                }
            }),
            Some(Limit::Depth(small.depth)),
        ),
        (
            "many-files",
            with(&|tar| {
                for i in 0..small.files {
                    tar.file(&format!("c/templates/{i}.yaml"), b"");
                }
            }),
            Some(Limit::Files(small.files)),
        ),
        (
            "huge-file",
            with(&|tar| tar.file("c/files/big.bin", &zeros(small.file_size + 1))),
            Some(Limit::FileSize(small.file_size)),
        ),
        (
            "long-name",
            with(&|tar| tar.file(&format!("c/{}", "n".repeat(2 * small.bytes as usize)), b"")),
            Some(Limit::Bytes(small.bytes)),
        ),
        (
            "lying-header",
            with(&|tar| tar.raw("c/files/x", tar::EntryType::Regular, 1 << 40, b"short")),
            Some(Limit::FileSize(small.file_size)),
        ),
        (
            "dot-dot",
            with(&|tar| tar.file("c/charts/../../escape", b"")),
            None,
        ),
        (
            "symlink",
            with(&|tar| tar.link("c/charts/x.tgz", "/etc/passwd", tar::EntryType::Symlink)),
            None,
        ),
        (
            "two-members",
            {
                let mut bytes = gzip(&{
                    let mut tar = Tar::default();
                    tar.file("c/Chart.yaml", chart_yaml);
                    tar.finish(false)
                });
                bytes.extend(gzip(&{
                    let mut tar = Tar::default();
                    tar.file(
                        "c/charts/s/Chart.yaml",
                        b"apiVersion: v2\nname: s\nversion: 1\n",
                    );
                    tar.finish(true)
                }));
                bytes
            },
            None,
        ),
    ]
}

#[test]
fn each_seed_of_the_fuzz_corpus_is_refused_for_its_limit() {
    for (name, bytes, limit) in seeds() {
        archives::check(&bytes, &archives::SMALL);
        let result =
            chart::load_archive_with(&bytes, Location::archive(archives::NAME), &archives::SMALL);
        match (limit, result) {
            (Some(expected), Err(ChartError::TooLarge { limit, .. })) => {
                assert_eq!(limit, expected, "{name}")
            }
            (Some(_), other) => panic!("{name}: {other:?}"),
            (None, Err(ChartError::TooLarge { .. })) => panic!("{name}: refused for a limit"),
            (None, _) => {}
        }
    }
}

/// The seed corpus of the fuzz target, `fuzz/corpus/chart_archive`: an input whose first byte
/// is odd is an archive as it is, else a recipe for [`archives::archive`].
#[test]
fn the_fuzz_corpus_holds_the_seeds() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/chart_archive");
    let mut expected: Vec<(String, Vec<u8>)> = seeds()
        .into_iter()
        .map(|(name, bytes, _)| {
            (
                format!("seed-archive-{name}"),
                [&[1u8][..], &bytes].concat(),
            )
        })
        .collect();
    for (index, recipe) in [&b""[..], b"\x00\x01\x02\x03", b"\x05\x00\x02\x00\x03\x00"]
        .iter()
        .enumerate()
    {
        expected.push((
            format!("seed-recipe-{index}"),
            [&[0u8][..], recipe].concat(),
        ));
    }
    if std::env::var_os("SEQUENCED_WRITE_FUZZ_CORPUS").is_some() {
        std::fs::create_dir_all(&corpus).unwrap();
        for (name, bytes) in &expected {
            std::fs::write(corpus.join(name), bytes).unwrap();
        }
    }
    for (name, bytes) in &expected {
        let committed = std::fs::read(corpus.join(name)).unwrap_or_default();
        assert!(
            committed == *bytes,
            "fuzz/corpus/chart_archive/{name} is not the seed: \
             SEQUENCED_WRITE_FUZZ_CORPUS=1 cargo nextest run --test chart_archives writes it"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the recipe, the loader returns within its budget, and refusals name the chart.
    #[test]
    fn hostile_archives_are_loaded_within_the_limits(recipe in prop::collection::vec(any::<u8>(), 0..256)) {
        archives::check(&archives::archive(&recipe), &archives::SMALL);
    }

    /// The same, for bytes that are an archive as they are, mostly broken.
    #[test]
    fn any_bytes_are_loaded_within_the_limits(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        let mut gzipped = gzip(&bytes);
        archives::check(&gzipped, &archives::SMALL);
        gzipped.truncate(gzipped.len() / 2);
        archives::check(&gzipped, &archives::SMALL);
        archives::check(&bytes, &archives::SMALL);
    }
}
