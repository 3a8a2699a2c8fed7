//! Helm's provenance files, checked as `helm verify --keyring` checks them: the `.prov` beside
//! an archive is a PGP clear-signed message whose text is the chart's Chart.yaml, `...`, and a
//! `files:` map from the archive's file name to `sha256:<hex>`. It verifies when a key of the
//! keyring (its primary key or a bound subkey) made its signature and the archive's SHA-256 is
//! the one it signs for the archive's name. rPGP does the OpenPGP part.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pgp::composed::{CleartextSignedMessage, PublicOrSecret, SignedPublicKey};
use pgp::types::KeyDetails as _;

use super::{Keyring, VerifyError};
use crate::api::ChartVerified;

/// Where the provenance file of `archive` is: beside it, as helm writes it.
pub fn file_of(archive: &Path) -> PathBuf {
    let mut name = archive.as_os_str().to_owned();
    name.push(".prov");
    PathBuf::from(name)
}

/// The public keys of a keyring, each with the name of the key (or file) it came from.
pub fn keys_of(keyring: &Keyring) -> Result<Vec<(String, SignedPublicKey)>, VerifyError> {
    let mut out = Vec::new();
    for (name, bytes) in &keyring.keys {
        let bad = |what: String| VerifyError(format!("key {name} of {}: {what}", keyring.origin));
        let (keys, _) = PublicOrSecret::from_reader_many(bytes.as_slice())
            .map_err(|e| bad(format!("not an OpenPGP public key: {e}")))?;
        let before = out.len();
        for key in keys {
            match key.map_err(|e| bad(format!("not an OpenPGP public key: {e}")))? {
                PublicOrSecret::Public(key) => {
                    key.verify_bindings().map_err(|e| {
                        bad(format!(
                            "the key {:X} is not bound to its user ids and subkeys: {e}",
                            key.fingerprint()
                        ))
                    })?;
                    out.push((name.clone(), key));
                }
                PublicOrSecret::Secret(_) => {
                    return Err(bad(
                        "holds a secret key: a keyring holds public keys only (gpg --export)"
                            .to_string(),
                    ));
                }
            }
        }
        if out.len() == before {
            return Err(bad("holds no OpenPGP public key".to_string()));
        }
    }
    if out.is_empty() {
        return Err(VerifyError(format!("{} holds no key", keyring.origin)));
    }
    Ok(out)
}

/// Verifies the archive at `archive` against the provenance file beside it.
pub fn verify_file(archive: &Path, keyring: &Keyring) -> Result<ChartVerified, VerifyError> {
    let file_name = archive
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prov_path = file_of(archive);
    let provenance = match std::fs::read(&prov_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(VerifyError(format!(
                "no provenance file: the source serves no {file_name}.prov"
            )));
        }
        Err(e) => {
            return Err(VerifyError(format!(
                "{}: {}",
                prov_path.display(),
                crate::chart::io_message(&e)
            )));
        }
    };
    let digest = crate::chart::pin::archive_digest(archive).map_err(|e| {
        VerifyError(format!(
            "{}: {}",
            archive.display(),
            crate::chart::io_message(&e)
        ))
    })?;
    let keys = keys_of(keyring)?;
    verify(&provenance, &file_name, &digest, &keys, &keyring.origin)
}

/// Verifies provenance file `provenance` for the archive named `file_name` whose digest is
/// `digest` (`sha256:<hex>`) against `keys` (of `origin`, for messages).
pub fn verify(
    provenance: &[u8],
    file_name: &str,
    digest: &str,
    keys: &[(String, SignedPublicKey)],
    origin: &str,
) -> Result<ChartVerified, VerifyError> {
    let text = std::str::from_utf8(provenance).map_err(|_| {
        VerifyError("the provenance file is not a PGP signed message: not UTF-8".to_string())
    })?;
    let (message, _) = CleartextSignedMessage::from_string(text).map_err(|e| {
        VerifyError(format!(
            "the provenance file is not a PGP signed message: {e}"
        ))
    })?;
    let signer = keys.iter().find_map(|(_, key)| {
        let primary = message.verify(key).is_ok();
        let subkey = || {
            key.public_subkeys
                .iter()
                .any(|subkey| message.verify(subkey).is_ok())
        };
        (primary || subkey()).then_some(key)
    });
    let Some(key) = signer else {
        let tried: Vec<String> = keys
            .iter()
            .map(|(name, key)| format!("{name}: {:X}", key.fingerprint()))
            .collect();
        let by: Vec<String> = message
            .signatures()
            .iter()
            .flat_map(|s| {
                let fingerprints = s.issuer_fingerprint().into_iter().map(|f| format!("{f:X}"));
                let ids = s
                    .issuer_key_id()
                    .into_iter()
                    .map(|k| hex::encode_upper(k.as_ref()));
                fingerprints.chain(ids).collect::<Vec<_>>()
            })
            .collect();
        let by = match by.first() {
            Some(first) => format!("signed by {first}"),
            None => "no signature names its key".to_string(),
        };
        return Err(VerifyError(format!(
            "the provenance file is not signed by a key of {origin} ({by}; tried {})",
            tried.join(", ")
        )));
    };
    let signed = message.signed_text().replace("\r\n", "\n");
    let files = signed_files(&signed)?;
    let Some(signed_digest) = files.get(file_name) else {
        return Err(VerifyError(format!(
            "the provenance file signs no digest for {file_name}"
        )));
    };
    if signed_digest != digest {
        return Err(VerifyError(format!(
            "the archive's digest {digest} is not the {signed_digest} its provenance file signs for {file_name}"
        )));
    }
    let signer = key
        .details
        .users
        .first()
        .map(|user| String::from_utf8_lossy(user.id.id()).into_owned());
    Ok(ChartVerified {
        provider: "helm".to_string(),
        key: Some(format!("{:X}", key.fingerprint())),
        signer,
        identity: None,
    })
}

/// The `files:` map of a provenance file's signed text: after the `...` line that ends the
/// chart's Chart.yaml.
fn signed_files(text: &str) -> Result<BTreeMap<String, String>, VerifyError> {
    #[derive(serde::Deserialize)]
    struct Files {
        #[serde(default)]
        files: BTreeMap<String, String>,
    }
    let block = text
        .split_once("\n...\n")
        .map(|(_, files)| files)
        .ok_or_else(|| {
            VerifyError(
                "the provenance file's signed text has no files block (after a ... line)"
                    .to_string(),
            )
        })?;
    let files: Files = serde_yaml_ng::from_str(block).map_err(|e| {
        VerifyError(format!(
            "the provenance file's files block does not parse: {e}"
        ))
    })?;
    Ok(files.files)
}
