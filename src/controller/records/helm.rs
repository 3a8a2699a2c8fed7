//! Helm's own records of a release sequenced goes on from: a pending record taken over
//! (marked failed) and the last record Helm wrote, read as what the next revision prunes against.

use super::*;

impl Records {
    /// Marks the pending record of Helm's `pending` failed ([`crate::rollout::takeover::TAKEN_OVER`]),
    /// only while it is at the resourceVersion it was seen unchanged at; false when it changed
    /// meanwhile (a helm process finished it after all) or is gone.
    pub async fn take_pending(
        &self,
        release: &Release,
        me: &Identity,
        pending: &Pending,
    ) -> Result<bool, Error> {
        let what = format!(
            "taking over the pending release record {}/{}",
            namespace(release),
            pending.record
        );
        let secrets = self.secrets(release);
        let Some(secret) = secrets
            .get_opt(&pending.record)
            .await
            .map_err(kube_error(what.clone()))?
        else {
            return Ok(false);
        };
        if secret.metadata.resource_version.as_deref() != Some(pending.resource_version.as_str()) {
            return Ok(false);
        }
        let description = crate::rollout::takeover::TAKEN_OVER;
        match self
            .restatus(release, me, secret, HelmStatus::Failed, Some(description))
            .await
        {
            Ok(()) => Ok(true),
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes record Secret `secret` of Helm's with `status` and `description` (the rest as Helm
    /// wrote it), noting that this release took it over; a replace with the resourceVersion it
    /// was read at.
    pub(super) async fn restatus(
        &self,
        release: &Release,
        me: &Identity,
        mut secret: Secret,
        status: HelmStatus,
        description: Option<&str>,
    ) -> Result<(), Error> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let what = format!("writing release record {}/{name}", namespace(release));
        let (encoded, _) = restatus(
            &name,
            data_of(&secret, HELM_RECORD_KEY),
            status,
            description,
        )
        .map_err(|e| Error::Internal(format!("{what}: {e}")))?;
        secret.data.get_or_insert_with(Default::default).insert(
            HELM_RECORD_KEY.to_string(),
            ByteString(encoded.into_bytes()),
        );
        secret
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("status".to_string(), status.as_str().to_string());
        let annotations = secret
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(OWNER_ANNOTATION.to_string(), me.owner.clone());
        annotations.insert(DRIVER_ANNOTATION.to_string(), DRIVER_HELM.to_string());
        self.secrets(release)
            .replace(&name, &PostParams::default(), &secret)
            .await
            .map_err(kube_error(what))?;
        Ok(())
    }

    /// The record of `revision` that Helm wrote, as what the revision that goes on from it
    /// prunes against: its manifest's objects, each with its namespace as `cluster` scopes its
    /// kind (objects of a kind the cluster does not serve are gone already). None when it is
    /// missing or cannot be read (logged).
    pub async fn helm_record(
        &self,
        release: &Release,
        me: &Identity,
        revision: i64,
        cluster: &Cluster,
    ) -> Result<Option<Record>, Error> {
        let name = helm_record_name(&me.release_name, revision);
        let what = format!("reading release record {}/{name}", namespace(release));
        let Some(secret) = self
            .secrets(release)
            .get_opt(&name)
            .await
            .map_err(kube_error(what))?
        else {
            return Ok(None);
        };
        let helm = match HelmRelease::decode(&name, data_of(&secret, HELM_RECORD_KEY)) {
            Ok(helm) => helm,
            Err(RecordError { name, message }) => {
                tracing::warn!(record = %name, %message, "ignoring an unreadable Helm release record");
                return Ok(None);
            }
        };
        let documents = match crate::yaml::parse_documents(&helm.manifest) {
            Ok(documents) => documents,
            Err(e) => {
                tracing::warn!(record = %name, error = %e, "ignoring the manifest of a Helm release record that does not parse");
                Vec::new()
            }
        };
        let mut objects = Vec::new();
        for document in documents {
            let text = |pointer: &str| document.pointer(pointer).and_then(Value::as_str);
            let (Some(api_version), Some(kind), Some(object_name)) =
                (text("/apiVersion"), text("/kind"), text("/metadata/name"))
            else {
                continue;
            };
            let namespaced = match cluster.kind(api_version, kind).await {
                Ok(kind) => kind.namespaced,
                Err(ClusterError::UnknownKind { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            objects.push(ObjectKey {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
                namespace: namespaced.then(|| {
                    text("/metadata/namespace")
                        .unwrap_or(&me.target_namespace)
                        .to_string()
                }),
                name: object_name.to_string(),
            });
        }
        let chart = helm
            .chart
            .metadata
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(&me.release_name)
            .to_string();
        Ok(Some(Record {
            revision,
            digest: String::new(),
            chart_version: helm
                .chart
                .metadata
                .get("version")
                .and_then(Value::as_str)
                .map(str::to_string),
            sequenced: false,
            inventory: Inventory::of_helm(&chart, objects),
            chart,
            prune: Vec::new(),
            hooks: Vec::new(),
            upgrade: Some(revision > 1),
            crds: None,
            plan: None,
            rollback_to: None,
            went_on_from: None,
            chart_artifact: None,
            tests: Vec::new(),
            content: Content {
                chart_metadata: helm.chart.metadata,
                values: helm.config,
                manifest: helm.manifest,
            },
            info: Info {
                status: helm.info.status,
                description: helm.info.description,
                first_deployed: helm.info.first_deployed,
                last_deployed: helm.info.last_deployed,
            },
        }))
    }
}
