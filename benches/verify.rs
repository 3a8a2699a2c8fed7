//! What verifying a chart costs per fetch (`spec.chart.verify`, `provider: helm`): reading the
//! keyring, hashing the archive and checking the provenance file's signature, for a small chart
//! and for one whose archive is 4 MiB, next to running `helm verify` on the same files (what
//! verifying with helm itself would cost). The charts are signed by the real `helm package
//! --sign` with a gpg test key (gpg must be installed: scripts/install-gnupg.sh).
//!
//! `cargo bench --bench verify`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sequenced::chart::verify::{Keyring, provenance};
use sequenced_testkit as support;
use support::signing::Signer;
use tempfile::TempDir;

/// Packages and signs chart `demo` holding `padding` bytes of incompressible data.
fn signed_chart(signer: &Signer, dir: &Path, padding: usize) -> PathBuf {
    let source = TempDir::new().unwrap();
    support::write(
        source.path(),
        "Chart.yaml",
        "apiVersion: v2\nname: demo\nversion: 1.0.0\n",
    );
    support::write(
        source.path(),
        "templates/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\ndata:\n  a: b\n",
    );
    let mut seed: u64 = 7;
    let noise: Vec<u8> = (0..padding)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u8
        })
        .collect();
    std::fs::write(source.path().join("blob.bin"), noise).unwrap();
    signer.package(source.path(), dir)
}

fn bench(c: &mut Criterion) {
    let signer = Signer::new("Chart Publisher <charts@example.com>");
    let dir = TempDir::new().unwrap();
    let small = signed_chart(&signer, &dir.path().join("small"), 0);
    let large = signed_chart(&signer, &dir.path().join("large"), 4 << 20);
    let keyring = Keyring {
        origin: "Secret default/keys".into(),
        keys: vec![(
            "publisher.asc".into(),
            signer.public_key_armored().into_bytes(),
        )],
    };
    let pubring = dir.path().join("pubring.gpg");
    std::fs::write(&pubring, signer.public_key()).unwrap();
    let mut group = c.benchmark_group("verify");
    group.measurement_time(Duration::from_secs(5));
    for (name, archive) in [("small chart", &small), ("4 MiB archive", &large)] {
        eprintln!(
            "{name}: {} bytes",
            std::fs::metadata(archive).map(|m| m.len()).unwrap_or(0)
        );
        group.bench_function(format!("helm provenance, {name}"), |b| {
            b.iter(|| provenance::verify_file(archive, &keyring).expect("verifies"))
        });
    }
    group.bench_function("keyring read (one armored key)", |b| {
        b.iter(|| provenance::keys_of(&keyring).expect("a key"))
    });
    group.sample_size(10);
    group.bench_function("helm verify process, small chart", |b| {
        b.iter(|| {
            let out = std::process::Command::new(support::helm())
                .arg("verify")
                .arg("--keyring")
                .arg(&pubring)
                .arg(&small)
                .output()
                .unwrap();
            assert!(out.status.success());
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
