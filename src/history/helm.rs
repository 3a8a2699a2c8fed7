//! Helm's release storage format (`release.v1`), so that `helm list`, `helm history`,
//! `helm get manifest|values` and `helm status` can read a revision: a Secret
//! `sh.helm.release.v1.<release>.v<N>` of type `helm.sh/release.v1`, labelled `name`,
//! `owner=helm`, `status` and `version`, whose `release` key holds base64 of the gzip of the
//! release JSON. Helm ignores fields it does not know, so what sequenced needs beyond Helm's
//! fields travels in the same JSON under `sequenced`.
//!
//! Encoding and decoding are pure; the controller reads and writes the Secrets.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::RecordError;

/// The Secret type of Helm's release records.
pub const HELM_RECORD_TYPE: &str = "helm.sh/release.v1";
/// The Secret key that holds an encoded release.
pub const HELM_RECORD_KEY: &str = "release";

/// The Secret name of revision `version` of Helm release `name`.
pub fn helm_record_name(name: &str, version: i64) -> String {
    format!("sh.helm.release.v1.{name}.v{version}")
}

/// A release's status, spelt as Helm spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HelmStatus {
    #[default]
    Unknown,
    Deployed,
    Uninstalled,
    Superseded,
    Failed,
    Uninstalling,
    PendingInstall,
    PendingUpgrade,
    PendingRollback,
}

impl HelmStatus {
    /// Reads Helm's spelling (the `status` label, `info.status`); anything else is `Unknown`.
    pub fn parse(text: &str) -> HelmStatus {
        [
            HelmStatus::Deployed,
            HelmStatus::Uninstalled,
            HelmStatus::Superseded,
            HelmStatus::Failed,
            HelmStatus::Uninstalling,
            HelmStatus::PendingInstall,
            HelmStatus::PendingUpgrade,
            HelmStatus::PendingRollback,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
        .unwrap_or(HelmStatus::Unknown)
    }

    /// Whether an operation was under way when the record was last written (`pending-*`):
    /// every later `helm` refuses "another operation (install/upgrade/rollback) is in
    /// progress" while it is the last record.
    pub fn is_pending(self) -> bool {
        matches!(
            self,
            HelmStatus::PendingInstall | HelmStatus::PendingUpgrade | HelmStatus::PendingRollback
        )
    }

    /// As in the `status` label and `helm list`.
    pub fn as_str(self) -> &'static str {
        match self {
            HelmStatus::Unknown => "unknown",
            HelmStatus::Deployed => "deployed",
            HelmStatus::Uninstalled => "uninstalled",
            HelmStatus::Superseded => "superseded",
            HelmStatus::Failed => "failed",
            HelmStatus::Uninstalling => "uninstalling",
            HelmStatus::PendingInstall => "pending-install",
            HelmStatus::PendingUpgrade => "pending-upgrade",
            HelmStatus::PendingRollback => "pending-rollback",
        }
    }
}

/// A field Helm (Go) writes as `null` when it is empty (a release installed without values has
/// `"config": null`, a chart without files `"files": null`): read as the empty value.
fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// `info` of a Helm release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelmInfo {
    /// RFC 3339 times, as Helm writes them.
    #[serde(default, deserialize_with = "or_default")]
    pub first_deployed: String,
    #[serde(default, deserialize_with = "or_default")]
    pub last_deployed: String,
    #[serde(default, deserialize_with = "or_default")]
    pub deleted: String,
    #[serde(default, deserialize_with = "or_default")]
    pub description: String,
    pub status: HelmStatus,
    #[serde(default, deserialize_with = "or_default")]
    pub notes: String,
}

/// The chart of a Helm release: its metadata (Chart.yaml) and default values. Templates and
/// files are left empty: nothing that reads a record needs them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelmChart {
    #[serde(default, deserialize_with = "or_default")]
    pub metadata: Map<String, Value>,
    #[serde(default, deserialize_with = "or_default")]
    pub values: Map<String, Value>,
    #[serde(default, deserialize_with = "or_default")]
    pub templates: Vec<Value>,
    #[serde(default, deserialize_with = "or_default")]
    pub files: Vec<Value>,
}

/// One revision as Helm stores it, with sequenced's own part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelmRelease {
    pub name: String,
    pub namespace: String,
    pub version: i64,
    pub info: HelmInfo,
    pub chart: HelmChart,
    /// The user's values (`helm get values`).
    #[serde(default, deserialize_with = "or_default")]
    pub config: Map<String, Value>,
    /// The rendered resources (`helm get manifest`).
    #[serde(default, deserialize_with = "or_default")]
    pub manifest: String,
    #[serde(default, deserialize_with = "or_default")]
    pub hooks: Vec<Value>,
    /// What sequenced keeps beyond Helm's fields; Helm ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequenced: Option<Value>,
}

impl HelmRelease {
    /// The labels Helm's Secret driver puts on the record.
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("name".to_string(), self.name.clone()),
            ("owner".to_string(), "helm".to_string()),
            ("status".to_string(), self.info.status.as_str().to_string()),
            ("version".to_string(), self.version.to_string()),
        ])
    }

    /// The value of the Secret's `release` key: base64 of the gzip of the JSON (the Secret's
    /// own base64 comes on top, as for any Secret data).
    pub fn encode(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(super::gzip_json(self))
    }

    /// Reads what [`HelmRelease::encode`] (or Helm) wrote; `name` is the Secret, for the error.
    /// Helm also reads records that are base64 of plain JSON, and so does this.
    pub fn decode(name: &str, data: &[u8]) -> Result<HelmRelease, RecordError> {
        let error = |message: String| RecordError {
            name: name.to_string(),
            message,
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| error(format!("not base64: {e}")))?;
        let json = if bytes.starts_with(&[0x1f, 0x8b]) {
            super::gunzip(&bytes).map_err(|e| error(format!("not gzip: {e}")))?
        } else {
            bytes
        };
        serde_json::from_slice(&json).map_err(|e| error(format!("not a Helm release: {e}")))
    }
}

/// The `release` data of a record Helm wrote (`data`, as the Secret holds it) with its status
/// and description changed, everything else kept as Helm wrote it (the chart's templates, the
/// hooks, fields this crate does not know): what sequenced writes when it takes a pending record
/// over (`failed`) or supersedes the deployed one it upgraded (whose description, as Helm leaves
/// it, stays: `description` None). Also returns the record's `info.status` before the change.
pub fn restatus(
    name: &str,
    data: &[u8],
    status: HelmStatus,
    description: Option<&str>,
) -> Result<(String, HelmStatus), RecordError> {
    let error = |message: String| RecordError {
        name: name.to_string(),
        message,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| error(format!("not base64: {e}")))?;
    let json = if bytes.starts_with(&[0x1f, 0x8b]) {
        super::gunzip(&bytes).map_err(|e| error(format!("not gzip: {e}")))?
    } else {
        bytes
    };
    let mut release: Value =
        serde_json::from_slice(&json).map_err(|e| error(format!("not a Helm release: {e}")))?;
    let Some(info) = release.get_mut("info").and_then(Value::as_object_mut) else {
        return Err(error("not a Helm release: it has no info".to_string()));
    };
    let before = info
        .get("status")
        .and_then(Value::as_str)
        .map_or(HelmStatus::Unknown, HelmStatus::parse);
    info.insert("status".into(), Value::from(status.as_str()));
    if let Some(description) = description {
        info.insert("description".into(), Value::from(description));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(super::gzip_json(&release));
    Ok((encoded, before))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn release() -> HelmRelease {
        HelmRelease {
            name: "shop".into(),
            namespace: "apps".into(),
            version: 3,
            info: HelmInfo {
                first_deployed: "2026-11-23T19:11:57Z".into(),
                last_deployed: "2026-11-23T19:11:59Z".into(),
                deleted: String::new(),
                description: "Upgrade complete".into(),
                status: HelmStatus::PendingUpgrade,
                notes: String::new(),
            },
            chart: HelmChart {
                metadata: json!({"name": "shop", "version": "0.1.0", "apiVersion": "v2"})
                    .as_object()
                    .cloned()
                    .unwrap(),
                values: Map::new(),
                templates: Vec::new(),
                files: Vec::new(),
            },
            config: json!({"replicas": 2}).as_object().cloned().unwrap(),
            manifest: "---\n# Source: shop/templates/cm.yaml\nkind: ConfigMap\n".into(),
            hooks: Vec::new(),
            sequenced: Some(json!({"layers": ["a"]})),
        }
    }

    #[test]
    fn releases_round_trip_with_helms_labels_and_status_spelling() {
        let r = release();
        let decoded = HelmRelease::decode("s", r.encode().as_bytes()).unwrap();
        assert_eq!(decoded, r);
        assert_eq!(r.labels()["status"], "pending-upgrade");
        assert_eq!(r.labels()["version"], "3");
        assert_eq!(helm_record_name("shop", 3), "sh.helm.release.v1.shop.v3");
        let text = serde_json::to_value(&r).unwrap();
        assert_eq!(text["info"]["status"], "pending-upgrade");
    }

    #[test]
    fn plain_json_records_read_and_garbage_is_an_error_naming_the_secret() {
        let plain = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_vec(&release()).unwrap());
        assert_eq!(
            HelmRelease::decode("s", plain.as_bytes()).unwrap().version,
            3
        );
        let err = HelmRelease::decode("sh.helm.release.v1.shop.v3", b"%%").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("release record sh.helm.release.v1.shop.v3: not base64"),
            "{err}"
        );
    }
}
