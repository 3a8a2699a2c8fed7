//! Chart digests: the SHA-256 of a fetched archive, the OCI manifest digest helm pulled, and
//! the `@sha256:` pins a reference or version may carry (`oci://registry/charts/app@sha256:…`,
//! `version: 1.2.3@sha256:…`).
//!
//! A pin on an OCI chart is its manifest digest, and helm pulls by it; a pin on a repository
//! chart is the SHA-256 of its archive (what `index.yaml` lists as `digest`), checked once the
//! archive is fetched. Pure, but for [`archive_digest`], which reads a file.

use std::io::Read as _;
use std::path::Path;

use sha2::{Digest as _, Sha256};

/// What a chart reference asks helm for once its pins are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The OCI reference helm pulls (with the pin, `…@sha256:…`, when there is one); the URL
    /// of a repository as it is.
    pub reference: String,
    /// The version given to `helm pull --version`, without a pin.
    pub version: Option<String>,
    /// The digest asked for: `sha256:<hex>`.
    pub digest: Option<String>,
}

/// Why a pin cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPin(pub String);

/// Splits `text` at its `@sha256:` pin, checking the pin's form.
fn split(text: &str) -> Result<(&str, Option<String>), BadPin> {
    let Some((before, hex)) = text.split_once("@sha256:") else {
        if text.contains('@') {
            return Err(BadPin(format!(
                "{text:?}: a pin is @sha256: and 64 lowercase hexadecimal digits"
            )));
        }
        return Ok((text, None));
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(BadPin(format!(
            "{text:?}: a pin is @sha256: and 64 lowercase hexadecimal digits"
        )));
    }
    Ok((before, Some(format!("sha256:{hex}"))))
}

/// An OCI reference and version with their pins read: a pin in the version
/// (`1.2.3@sha256:…`) becomes the reference's (`oci://…:1.2.3@sha256:…`, as helm pulls it).
pub fn oci(reference: &str, version: Option<&str>) -> Result<Pinned, BadPin> {
    let reference = reference.trim_end_matches('/');
    let (bare, in_reference) = split(reference)?;
    let (version, in_version) = match version.filter(|v| !v.is_empty()) {
        Some(version) => {
            let (version, pin) = split(version)?;
            (Some(version).filter(|v| !v.is_empty()), pin)
        }
        None => (None, None),
    };
    match (in_reference, in_version) {
        (Some(a), Some(b)) if a != b => Err(BadPin(format!(
            "the reference is pinned to {a} and the version to {b}"
        ))),
        (None, None) => Ok(Pinned {
            reference: bare.to_string(),
            version: version.map(str::to_string),
            digest: None,
        }),
        (Some(digest), _) | (None, Some(digest)) => {
            // The version becomes the reference's tag, so that helm checks both.
            let tagged = match version {
                Some(version) if !has_tag(bare) => format!("{bare}:{}", version.replace('+', "_")),
                _ => bare.to_string(),
            };
            Ok(Pinned {
                reference: format!("{tagged}@{digest}"),
                version: None,
                digest: Some(digest),
            })
        }
    }
}

/// A repository chart's version with its pin read: the pin is the archive's SHA-256.
pub fn repository(url: &str, version: Option<&str>) -> Result<Pinned, BadPin> {
    let (version, digest) = match version.filter(|v| !v.is_empty()) {
        Some(version) => {
            let (version, pin) = split(version)?;
            (Some(version.to_string()).filter(|v| !v.is_empty()), pin)
        }
        None => (None, None),
    };
    Ok(Pinned {
        reference: url.trim_end_matches('/').to_string(),
        version,
        digest,
    })
}

/// Whether the last path component of an OCI reference has a `:tag`.
fn has_tag(reference: &str) -> bool {
    let rest = reference.strip_prefix("oci://").unwrap_or(reference);
    rest.split_once('/').is_some_and(|(_, path)| {
        path.rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
    })
}

/// The manifest digest in what `helm pull` of an OCI chart printed (`Digest: sha256:…`).
pub fn pulled_digest(output: &str) -> Option<String> {
    output.lines().find_map(|line| {
        let digest = line.trim().strip_prefix("Digest:")?.trim();
        split(&format!("@{digest}")).ok()?.1
    })
}

/// `sha256:<hex>` of a file's bytes.
pub fn archive_digest(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// `sha256:<hex>` of bytes.
pub fn bytes_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "520282ed805b2141cd3212c0b95cca8c374aea9de457b1a35bd999449b36c74c";

    #[test]
    fn oci_pins_are_read_from_the_reference_or_the_version() {
        let plain = oci("oci://r:5000/charts/demo", Some("1.2.3")).unwrap();
        assert_eq!(plain.reference, "oci://r:5000/charts/demo");
        assert_eq!(plain.version.as_deref(), Some("1.2.3"));
        assert_eq!(plain.digest, None);

        let pinned = oci(&format!("oci://r:5000/charts/demo@sha256:{HEX}"), None).unwrap();
        assert_eq!(
            pinned.reference,
            format!("oci://r:5000/charts/demo@sha256:{HEX}")
        );
        assert_eq!(pinned.digest, Some(format!("sha256:{HEX}")));

        let versioned = oci(
            "oci://r:5000/charts/demo",
            Some(&format!("1.2.3+b@sha256:{HEX}")),
        )
        .unwrap();
        assert_eq!(
            versioned.reference,
            format!("oci://r:5000/charts/demo:1.2.3_b@sha256:{HEX}")
        );
        assert_eq!(versioned.version, None);

        let other = "b".repeat(64);
        assert!(
            oci(
                &format!("oci://r/charts/demo@sha256:{HEX}"),
                Some(&format!("1.0.0@sha256:{other}"))
            )
            .is_err()
        );
        assert!(oci("oci://r/charts/demo", Some("1.0.0@sha256:abc")).is_err());
        assert!(oci("oci://r/charts/demo", Some("1.0.0@sha512:abc")).is_err());
    }

    #[test]
    fn repository_pins_are_the_archive_digest() {
        let pinned = repository("http://h/charts/", Some(&format!("0.1.0@sha256:{HEX}"))).unwrap();
        assert_eq!(pinned.reference, "http://h/charts");
        assert_eq!(pinned.version.as_deref(), Some("0.1.0"));
        assert_eq!(pinned.digest, Some(format!("sha256:{HEX}")));
        assert_eq!(repository("http://h", Some("^1")).unwrap().digest, None);
    }

    #[test]
    fn the_pulled_digest_is_read_from_helms_output() {
        let output = format!("Pulled: r:5000/charts/demo:0.1.0\nDigest: sha256:{HEX}\n");
        assert_eq!(pulled_digest(&output), Some(format!("sha256:{HEX}")));
        assert_eq!(pulled_digest("Pulled: x\n"), None);
        assert_eq!(pulled_digest("Digest: sha256:zz\n"), None);
    }
}
