//! Chart verification (`spec.chart.verify`, `--verify`): a fetched chart is checked before the
//! loader or helm read anything of it.
//!
//! - [`provenance`]: Helm's provenance file (`.prov`, `provider: helm`): a PGP clear-signed
//!   message holding the chart's Chart.yaml and the SHA-256 of its archive, checked against a
//!   keyring as `helm verify --keyring` checks it, with rPGP (no cryptography of our own).
//!
//! What verified a chart (the provider, the key's fingerprint, who it names) is kept with the
//! chart's digests ([`crate::api::ChartVerified`]).

pub mod provenance;

use crate::api::ChartVerified;

/// The keys a chart must be signed with, and where they came from (for messages).
#[derive(Clone, PartialEq, Eq)]
pub struct Keyring {
    /// Where the keys are: `Secret NAMESPACE/NAME`, or a file of the command line.
    pub origin: String,
    /// Each key by its name in the Secret (or the file's name) and its bytes: binary or
    /// ASCII-armored OpenPGP public keys, one or many.
    pub keys: Vec<(String, Vec<u8>)>,
}

impl Keyring {
    /// The keyring of a Secret's keys whose names end in `.gpg` or `.asc` (as Flux reads a
    /// keyring Secret); Err says why there is none.
    pub fn of_secret(
        origin: String,
        data: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<Keyring, String> {
        let mut keys: Vec<(String, Vec<u8>)> = data
            .into_iter()
            .filter(|(name, _)| name.ends_with(".gpg") || name.ends_with(".asc"))
            .collect();
        keys.sort();
        if keys.is_empty() {
            return Err(format!(
                "{origin} has no key ending in .gpg or .asc (the public keys of a keyring)"
            ));
        }
        Ok(Keyring { origin, keys })
    }
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("origin", &self.origin)
            .field(
                "keys",
                &self.keys.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// How a chart is verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Helm's provenance file against a keyring.
    Helm(Keyring),
}

impl Verification {
    /// The provider's name, as `spec.chart.verify.provider` spells it.
    pub fn provider(&self) -> &'static str {
        match self {
            Verification::Helm(_) => "helm",
        }
    }

    /// Whether the fetch must bring the provenance file.
    pub fn needs_provenance(&self) -> bool {
        matches!(self, Verification::Helm(_))
    }
}

/// Why a chart did not verify: what was tried and what failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VerifyError(pub String);

/// Verifies the archive at `archive` (fetched, not read yet) as `verification` says.
pub fn verify(
    archive: &std::path::Path,
    verification: &Verification,
) -> Result<ChartVerified, VerifyError> {
    match verification {
        Verification::Helm(keyring) => provenance::verify_file(archive, keyring),
    }
}
